"""Ray Train's `TensorflowTrainer` with 2 workers on a local Ray cluster (`ray.init(num_cpus=2)`).

Runs `examples/ray_train.py --quick` as a user would: each Ray worker builds its model with
`@kmp.parallelize` (from the `TF_CONFIG` Ray sets) and trains with `kmp.callbacks`
(`EarlyStopping` on a value that differs per worker, `ModelCheckpoint`, `StallWatchdog`).
Ray is a test-only, optional dependency (about 240 MB with its own dependencies, and this
test takes 2 to 3 minutes on 2 CPU cores): without it the test is skipped. To run it:

    pip install -e ".[tensorflow,test,ray]"
    python -m pytest -m ray tests/integration/test_ray_train.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [
    pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                       reason='Ray is not installed: pip install "keras_mgpu_plugins[tensorflow,ray]"'),
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ray")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    for name in ("TF_CONFIG", "KMP_LAUNCH_WORKER", "KMP_NUM_WORKERS", "KMP_WORKER_INDEX",
                 "KMP_JOB_DIR"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "ray_train.py"),
                           "--quick", "--out", str(out)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    workers = [json.loads((out / f"worker-{rank}.json").read_text()) for rank in range(2)]
    return out, summary, workers


def test_two_workers_two_replicas_from_rays_tf_config(run):
    _, summary, workers = run
    assert [w["rank"] for w in workers] == [0, 1]
    assert [w["is_chief"] for w in workers] == [True, False]
    for rank, w in enumerate(workers):
        assert w["num_workers"] == 2 and w["replicas"] == 2
        assert w["tf_config"]["task"] == {"type": "worker", "index": rank}
        assert len(w["tf_config"]["cluster"]["worker"]) == 2
    # StallWatchdog ran in both Ray workers and stopped with its fit.
    assert summary["heartbeats"] == {"heartbeat-0.json": "finished", "heartbeat-1.json": "finished"}
    print("ray", summary["ray"])


def test_identical_weights_on_both_workers(run):
    _, _, (chief, other) = run
    assert chief["weights_sha256"] == other["weights_sha256"]
    for a, b in zip(chief["weights"], other["weights"], strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def test_early_stopping_agrees_on_the_chiefs_epoch(run):
    # The chief's value rises (alone it stops after epoch 2), worker 1's falls (never stops).
    _, _, workers = run
    assert [w["epochs_run"] for w in workers] == [2, 2]


def test_checkpoints_written_once_by_the_chief(run):
    out, summary, (chief, other) = run
    assert summary["checkpoints"] == ["ckpt-1.weights.h5", "ckpt-2.weights.h5"]
    assert summary["other_files"] == []  # no temporary file left by either worker
    assert chief["checkpoints_saved"] == ["ckpt-1.weights.h5", "ckpt-2.weights.h5"]
    assert other["checkpoints_saved"] == []
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.load_weights(out / "ckpt-2.weights.h5")
    for saved, final in zip(model.get_weights(), chief["weights"], strict=True):
        np.testing.assert_allclose(saved, np.array(final), atol=1e-6)
