"""Every example runs, as a user runs it (a subprocess with `--quick` or `--epochs`), and does what it says.

Assertions read what the examples print and write: checkpoints that load and
hold the expected weights, per-worker records that agree. `examples/wandb_offline.py`
is run the same way by `tests/integration/test_wandb_example.py`. A missing
example fails its test. `mnist_cnn.py --mnist` needs the network, so its loader
is tested in-process, on stand-in arrays.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.timeout(400)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
RUN_TIMEOUT_S = 360


def example(name: str) -> pathlib.Path:
    path = EXAMPLES / name
    assert path.is_file(), f"examples/{name} is missing: docs/examples.md lists it"
    return path


def _env() -> dict[str, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    for name in ("TF_CONFIG", "KMP_LAUNCH_WORKER", "KMP_NUM_WORKERS", "KMP_WORKER_INDEX"):
        env.pop(name, None)
    return env


def run_example(path: pathlib.Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(path), *args], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if check:
        assert done.returncode == 0, f"{path.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def kmp_launch(path: pathlib.Path, *args: str, workers: int = 2, check: bool = True):
    """`kmp-launch -n 2 path args...`, as the docs write it (the console script when installed)."""
    script = pathlib.Path(sys.executable).parent / "kmp-launch"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "keras_mgpu_plugins.launch"]
    done = subprocess.run([*command, "-n", str(workers), "--timeout", str(RUN_TIMEOUT_S - 20),
                           str(path), *args], cwd=REPO_ROOT, env=_env(), capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    if check:
        assert done.returncode == 0, f"kmp-launch {path.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def last_json(stdout: str, prefix: str = "") -> dict:
    lines = [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix + "{")]
    assert lines, f"no JSON line in the output:\n{stdout[-3000:]}"
    return json.loads(lines[-1])


def weights_sha256(weights) -> str:
    digest = hashlib.sha256()
    for array in weights:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def import_example(name: str):
    """The example as a module, in this process (its `main` does not run)."""
    spec = importlib.util.spec_from_file_location(f"example_{pathlib.Path(name).stem}", example(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_model(path):
    import keras

    return keras.saving.load_model(path, compile=False)


# --- one process ---------------------------------------------------------------------


@pytest.mark.slow
def test_quickstart(tmp_path):
    done = run_example(example("quickstart.py"), "--quick", "--out", str(tmp_path))
    assert "Training on 2 replicas (Keras backend: tensorflow)" in done.stdout
    accuracy = float(re.search(r"validation accuracy ([0-9.]+)", done.stdout).group(1))
    assert accuracy > 0.3  # 10 classes: chance is 0.1
    best = load_model(tmp_path / "best.keras")
    assert best.input_shape == (None, 8, 8, 1) and best.output_shape == (None, 10)


@pytest.mark.slow
def test_mnist_cnn(tmp_path):
    done = run_example(example("mnist_cnn.py"), "--quick", "--out", str(tmp_path))
    result = last_json(done.stdout)
    assert result["strategy"] == "MirroredStrategy" and result["replicas"] == 2
    assert result["epochs_run"] == 2 and result["train_images"] == 512
    assert result["val_accuracy"][-1] > 0.3
    model = load_model(result["checkpoint"])
    assert model.input_shape == (None, 28, 28, 1)
    assert [type(layer).__name__ for layer in model.layers] == [
        "Conv2D", "MaxPooling2D", "Flatten", "Dense", "Dense"]


def test_mnist_cnn_real_mnist_loader_offline(monkeypatch):
    """`--mnist`: keras.datasets.mnist.load_data stands in (MNIST's shapes and dtypes, no download)."""
    import keras

    module = import_example("mnist_cnn.py")
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8) for n in (6, 4)]
    images[0][0, 0, :2] = 0, 255  # both ends of the range
    labels = [rng.integers(0, 10, size=(n,), dtype=np.uint8) for n in (6, 4)]
    raw = (images[0], labels[0]), (images[1], labels[1])  # as load_data returns MNIST
    monkeypatch.setattr(keras.datasets.mnist, "load_data", lambda: raw)
    assert module.parse_args(["--mnist"]).mnist and not module.parse_args([]).mnist
    (x, y), (x_val, y_val) = module.load_data(mnist=True)
    assert (x.shape, x_val.shape, y.shape, y_val.shape) == ((6, 28, 28, 1), (4, 28, 28, 1), (6,), (4,))
    (dx, dy), _ = module.load_data(mnist=False)  # the default data: what the model is built for
    assert (x.dtype, y.dtype) == (dx.dtype, dy.dtype) == (np.float32, np.int64)
    assert x.shape[1:] == dx.shape[1:] == module.IMAGE_SHAPE
    np.testing.assert_allclose(x[..., 0], raw[0][0] / 255.0, rtol=1e-6)  # scaled to [0, 1]
    np.testing.assert_allclose(x_val[..., 0], raw[1][0] / 255.0, rtol=1e-6)
    assert (x.min(), x.max()) == (0.0, 1.0)
    np.testing.assert_array_equal(y, raw[0][1])
    np.testing.assert_array_equal(y_val, raw[1][1])


@pytest.mark.slow
def test_legacy_multi_gpu_model(tmp_path):
    """`--epochs` (here, not `--quick`); the template holds the trained, best weights."""
    import keras
    from sklearn.datasets import load_digits

    done = run_example(example("legacy_multi_gpu_model.py"), "--epochs", "2", "--out", str(tmp_path))
    result = last_json(done.stdout)
    assert result["replicas"] == 2 and result["epochs_run"] == 2
    assert result["template_equals_parallel"] is True
    assert result["template_equals_best_checkpoint"] is True
    assert {p.name for p in tmp_path.iterdir()} >= {"my_model.keras", "best.keras"}
    saved = load_model(result["my_model"])
    best = load_model(result["best_checkpoint"])
    assert isinstance(saved, keras.Sequential)
    assert [layer.units for layer in saved.layers] == [128, 64, 10]
    assert weights_sha256(saved.get_weights()) == weights_sha256(best.get_weights())
    digits = load_digits()  # the example's test split
    x, labels = (digits.data / 16.0).astype("float32")[1536:], digits.target[1536:]
    accuracy = float(np.mean(saved.predict(x, verbose=0).argmax(axis=1) == labels))
    assert accuracy == pytest.approx(result["test_accuracy"], abs=1e-3)
    assert accuracy > 0.3  # trained: chance is 0.1


# --- two workers (kmp-launch) -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.multi_worker
def test_mnist_cnn_on_two_workers_matches_two_replicas(tmp_path):
    """Story 3: the same script, unchanged, on 2 workers trains as on 2 local replicas."""
    path = example("mnist_cnn.py")
    local = last_json(run_example(path, "--quick", "--out", str(tmp_path / "local")).stdout)
    done = kmp_launch(path, "--quick", "--out", str(tmp_path / "workers"))
    workers = last_json(done.stdout, prefix="[worker 0] ")
    assert "[worker 1] {" not in done.stdout  # only the chief reports
    assert workers["strategy"] == "MultiWorkerMirroredStrategy"
    assert workers["workers"] == 2 and workers["replicas"] == 2
    assert workers["epochs_run"] == local["epochs_run"] == 2
    np.testing.assert_allclose(workers["val_accuracy"], local["val_accuracy"], atol=0.005)
    assert os.path.exists(workers["checkpoint"])


@pytest.fixture(scope="module")
def all_callbacks_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("all_callbacks")
    done = kmp_launch(example("multi_worker_all_callbacks.py"), "--quick", "--out", str(out))
    return out, done


def _records(out: pathlib.Path) -> list[dict]:
    return [json.loads((out / f"worker-{i}.json").read_text()) for i in range(2)]


@pytest.mark.slow
@pytest.mark.multi_worker
def test_multi_worker_all_callbacks(all_callbacks_run):
    out, done = all_callbacks_run
    summary = last_json(done.stdout, prefix="[worker 0] ")
    assert summary == {
        "workers": 2, "same_final_weights": True, "epochs_run": [3, 3], "first_epoch": 0,
        "verifier_checks": 4, "verifier_mismatches": 0, "out": str(out),
    }
    chief, other = _records(out)
    assert chief["is_chief"] and not other["is_chief"]
    # EarlyStopping / sync: both workers ran the same epochs and hold the same weights after each.
    assert chief["epochs"] == other["epochs"] == [0, 1, 2]
    assert chief["epoch_sha256"] == other["epoch_sha256"]
    assert chief["final_sha256"] == other["final_sha256"]
    # ModelCheckpoint: one file, written once, holding the best epoch's weights.
    best_epoch = min(chief["val_loss"], key=chief["val_loss"].get)
    best = load_model(out / "best.keras")
    assert weights_sha256(best.get_weights()) == chief["epoch_sha256"][best_epoch]
    # BackupAndRestore deleted its backup after a complete run; nothing else was left behind.
    assert sorted(p.name for p in out.iterdir()) == [
        "best.keras", "device_metrics.csv", "worker-0.json", "worker-1.json"]
    # DeviceMetricsLogger: the chief's CSV covers both workers, one row per epoch.
    lines = (out / "device_metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert "host/worker0/memory_mb" in header and "host/worker1/memory_mb" in header
    assert len(lines) == 1 + 3


@pytest.mark.slow
@pytest.mark.multi_worker
def test_multi_worker_all_callbacks_resumes_after_a_failure(tmp_path, all_callbacks_run):
    path = example("multi_worker_all_callbacks.py")
    failed = kmp_launch(path, "--quick", "--out", str(tmp_path), "--fail-at-epoch", "2", check=False)
    assert failed.returncode != 0
    assert "simulated failure at the end of epoch 2" in failed.stdout + failed.stderr
    assert (tmp_path / "backup").is_dir() and not (tmp_path / "worker-0.json").exists()

    done = kmp_launch(path, "--quick", "--out", str(tmp_path))
    summary = last_json(done.stdout, prefix="[worker 0] ")
    assert summary["same_final_weights"] and summary["verifier_mismatches"] == 0
    resumed_at = summary["first_epoch"]
    assert resumed_at in (1, 2)  # the backup of epoch 2 (or, if the kill won the race, of epoch 1)
    assert summary["epochs_run"] == [3 - resumed_at] * 2
    assert not (tmp_path / "backup").exists()
    # Resuming is exact: the same weights, to the bit, as the run that was never interrupted.
    uninterrupted = _records(all_callbacks_run[0])[0]
    assert _records(tmp_path)[0]["final_sha256"] == uninterrupted["final_sha256"]


def test_ray_train_without_ray_names_the_extra_to_install(tmp_path):
    """Ray is blocked in the child (`sys.modules["ray"] = None`), installed or not."""
    path = example("ray_train.py")
    code = ("import runpy, sys; sys.modules['ray'] = None; "
            f"sys.argv = [{str(path)!r}, '--quick', '--out', {str(tmp_path)!r}]; "
            f"runpy.run_path({str(path)!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "examples/ray_train.py needs Ray Train and TensorFlow (import of ray halted; None in "
        "sys.modules): Ray's TensorflowTrainer runs TensorFlow in each worker. Install both "
        'with: pip install "keras_mgpu_plugins[tensorflow,ray]"'), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
