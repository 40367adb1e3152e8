"""A script on a cluster: no launcher, only the environment a scheduler sets.

Two plain processes run the same script, as Kubernetes (`TF_CONFIG`) or
`srun` (SLURM variables) would start them. The module-level `@kmp.parallelize`
creates the multi-worker strategy itself, before TensorFlow's runtime starts,
and `fit` trains across both: the workers end bit-identical, with the weights
one process reaches on the same global batches. A program with TensorFlow work
at module level before its factory runs through `python -m keras_mgpu_plugins.run`
(the code `kmp-launch`'s workers run), which creates the strategy first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conformance.starts import free_ports

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import keras
    import tensorflow as tf
    import keras_mgpu_plugins as kmp

    @kmp.parallelize   # applied at import: creates the strategy before any TF op
    def build_model():
        model = keras.Sequential([
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh",
                               kernel_initializer=keras.initializers.GlorotUniform(3)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4)),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    model = build_model()
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    topo = kmp.topology()
    print("RESULT " + json.dumps({
        "worker": topo.worker_index, "source": topo.source,
        "replicas": model.distribute_strategy.num_replicas_in_sync,
        "multi_worker": isinstance(model.distribute_strategy,
                                   tf.distribute.MultiWorkerMirroredStrategy),
        "loss": history.history["loss"],
        "weights": [w.tolist() for w in model.get_weights()],
    }), flush=True)
''')


def run_workers(tmp_path, envs: list[dict[str, str]], script_text: str = SCRIPT,
                runner: tuple[str, ...] = ()) -> list[dict]:
    """Runs `python [runner] train.py` once per environment in `envs`; their RESULT lines."""
    script = tmp_path / "train.py"
    script.write_text(script_text)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "KMP_")) and k != "TF_CONFIG"}
    procs = [subprocess.Popen([sys.executable, *runner, str(script)], env={**clean, **env},
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
             for env in envs]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:  # a hang or a failure must not leave a worker behind
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
    return results


def one_process_weights() -> list[np.ndarray]:
    """The same script's training in this process, without a strategy."""
    import keras

    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(3)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4)),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


def check(results: list[dict], source: str) -> None:
    assert [r["worker"] for r in results] == [0, 1]
    for r in results:
        assert (r["source"], r["replicas"], r["multi_worker"]) == (source, 2, True)
    assert results[0]["loss"] == results[1]["loss"]
    assert results[0]["weights"] == results[1]["weights"]  # bit-identical (exact JSON floats)
    for got, want in zip(results[0]["weights"], one_process_weights(), strict=True):
        np.testing.assert_allclose(np.array(got), want, atol=1e-5)


def srun_envs() -> list[dict[str, str]]:
    """What `srun -n 2` on one node sets in its 2 tasks (ports from KMP_SLURM_PORT_BASE)."""
    base = free_ports(2)[0]
    common = {"SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0",
              "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2",
              "SLURM_JOB_NODELIST": "localhost", "KMP_SLURM_PORT_BASE": str(base)}
    return [{**common, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)} for i in range(2)]


def tf_config_envs() -> list[dict[str, str]]:
    cluster = {"worker": [f"localhost:{p}" for p in free_ports(2)]}
    return [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
            for i in range(2)]


def test_srun_variables_alone_train_two_workers(tmp_path):
    check(run_workers(tmp_path, srun_envs()), "slurm")


def test_tf_config_alone_trains_two_workers_and_again_at_once_on_the_same_ports(tmp_path):
    """Then a requeue on the same TF_CONFIG ports: the first run's TIME_WAIT sockets do not
    block it (one job checks both: the first run is the TF_CONFIG-only run)."""
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    envs = [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
            for i in range(2)]
    first = run_workers(tmp_path, envs)
    check(first, "tf_config")
    second = run_workers(tmp_path, envs)  # at once: failed with "Port ... is already in use"
    assert [r["worker"] for r in second] == [0, 1]
    assert second[0]["weights"] == first[0]["weights"] == second[1]["weights"]


# A keras.io ViT-like program: TensorFlow work at module level (an image resize, a
# `Normalization` layer adapted on the data) before the `@kmp.parallelize` factory.
MODULE_LEVEL_WORK = textwrap.dedent('''
    import json
    import numpy as np
    import keras
    import tensorflow as tf
    import keras_mgpu_plugins as kmp

    rng = np.random.default_rng(7)
    images = tf.image.resize(rng.normal(size=(64, 8, 8, 1)).astype("float32"), (4, 4)).numpy()
    labels = rng.normal(size=(64, 1)).astype("float32")
    normalization = keras.layers.Normalization()
    normalization.adapt(images)   # TensorFlow's runtime starts here

    @kmp.parallelize
    def build_model():
        inputs = keras.Input((4, 4, 1))
        hidden = keras.layers.Flatten()(normalization(inputs))
        outputs = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(3))(hidden)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    model = build_model()
    history = model.fit(images, labels, batch_size=16, epochs=2, shuffle=False, verbose=0)
    topo = kmp.topology()
    print("RESULT " + json.dumps({
        "worker": topo.worker_index, "source": topo.source,
        "replicas": model.distribute_strategy.num_replicas_in_sync,
        "multi_worker": isinstance(model.distribute_strategy,
                                   tf.distribute.MultiWorkerMirroredStrategy),
        "loss": history.history["loss"],
        "weights": [w.tolist() for w in model.get_weights()],
    }), flush=True)
''')
RUNNER = ("-m", "keras_mgpu_plugins.run")


def test_module_level_tensorflow_work_fails_without_the_runner_and_the_error_names_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(MODULE_LEVEL_WORK)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "KMP_")) and k != "TF_CONFIG"}
    done = subprocess.run([sys.executable, str(script)], env={**clean, **tf_config_envs()[0]},
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "StrategyError: The multi-worker strategy must be created before" in done.stderr
    assert "python -m keras_mgpu_plugins.run train.py" in done.stderr, done.stderr[-2000:]


@pytest.fixture(scope="module")
def module_level_work_one_process(tmp_path_factory):
    """The same program through the runner, with no cluster: one process, no strategy."""
    [result] = run_workers(tmp_path_factory.mktemp("one"), [{}], MODULE_LEVEL_WORK, RUNNER)
    assert (result["source"], result["replicas"], result["multi_worker"]) == ("local", 1, False)
    return result


@pytest.mark.parametrize("envs", [tf_config_envs, srun_envs], ids=["tf_config", "slurm"])
def test_the_runner_creates_the_strategy_before_module_level_tensorflow_work(
        tmp_path, envs, module_level_work_one_process):
    """`python -m keras_mgpu_plugins.run train.py` in each worker, as a scheduler starts it."""
    results = run_workers(tmp_path, envs(), MODULE_LEVEL_WORK, RUNNER)
    source = "tf_config" if envs is tf_config_envs else "slurm"
    assert [r["worker"] for r in results] == [0, 1]
    for r in results:
        assert (r["source"], r["replicas"], r["multi_worker"]) == (source, 2, True)
    assert results[0]["loss"] == results[1]["loss"]
    assert results[0]["weights"] == results[1]["weights"]  # bit-identical (exact JSON floats)
    for got, want in zip(results[0]["weights"], module_level_work_one_process["weights"],
                         strict=True):
        np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)
