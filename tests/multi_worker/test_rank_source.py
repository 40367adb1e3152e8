"""One source of rank: the multi-worker strategy when there is one, this process alone otherwise.

Plain processes, as a scheduler or a user's own script starts them: a strategy
built on the user's own cluster resolver (no `TF_CONFIG`) ranks the workers, so
only its chief writes; four `srun` tasks that each train alone
(`strategy="default"`) each write their own files; and an environment that
gives a worker another rank than its strategy is a clear error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.multi_worker.test_cluster_env import free_ports

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import keras
    import tensorflow as tf
    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins import collective

    mode, out = os.environ["RANK_TEST_MODE"], sys.argv[1]
    if mode == "slurm_default":
        task, strategy = int(os.environ["SLURM_PROCID"]), "default"
    else:  # the user's own resolver, with or without a TF_CONFIG
        task, ports = int(os.environ["RANK_TEST_TASK"]), json.loads(os.environ["RANK_TEST_PORTS"])
        spec = tf.train.ClusterSpec({"worker": [f"localhost:{p}" for p in ports]})
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type="worker", task_id=task, rpc_layer="grpc")
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)

    @kmp.parallelize(strategy=strategy)
    def build_model():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    try:
        model = build_model()
    except kmp.TopologyError as err:
        print("RESULT " + json.dumps({"error": str(err)}), flush=True)
        sys.exit(0)
    here = os.path.join(out, f"task{task}")
    callbacks = [kmp.callbacks.ModelCheckpoint(os.path.join(here, "ckpt.weights.h5"),
                                               save_weights_only=True)]
    if mode == "slurm_default":
        callbacks.append(kmp.callbacks.BackupAndRestore(os.path.join(here, "backup"),
                                                        delete_checkpoint=False))
    x = np.arange(48, dtype="float32").reshape(16, 3) / 48
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=callbacks)
    print("RESULT " + json.dumps({
        "rank": collective.worker_index(), "workers": collective.num_workers(),
        "chief": collective.is_chief(),
        "files": sorted(os.listdir(here)) if os.path.isdir(here) else [],
    }), flush=True)
''')


def run_two(tmp_path, envs: list[dict[str, str]]) -> list[dict]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "KMP_")) and k != "TF_CONFIG"}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path)], env={**clean, **env},
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for env in envs]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
    return results


def test_own_cluster_resolver_without_tf_config_has_one_chief(tmp_path):
    ports = free_ports(2)
    envs = [{"RANK_TEST_MODE": "own", "RANK_TEST_TASK": str(i), "RANK_TEST_PORTS": json.dumps(ports)}
            for i in range(2)]
    results = run_two(tmp_path, envs)
    assert [(r["rank"], r["workers"], r["chief"]) for r in results] == [(0, 2, True), (1, 2, False)]
    assert results[0]["files"] == ["ckpt.weights.h5"]
    assert results[1]["files"] == []  # both wrote, when the chief was read from the environment


def test_environment_that_disagrees_with_the_strategy_is_a_clear_error(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    envs = [{"RANK_TEST_MODE": "own", "RANK_TEST_TASK": str(1 - i), "RANK_TEST_PORTS": json.dumps(ports),
             "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
            for i in range(2)]
    results = run_two(tmp_path, envs)
    for i, r in enumerate(results):
        assert f"worker {1 - i} of 2 in its multi-worker strategy" in r["error"]
        assert f"worker {i} of 2 in the environment (tf_config: TF_CONFIG)" in r["error"]


def test_srun_tasks_training_alone_each_write_their_own_files(tmp_path):
    """`srun -n 2` of a `strategy="default"` script: two independent runs, each its own chief."""
    common = {"RANK_TEST_MODE": "slurm_default", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
              "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost",
              "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "localhost"}
    results = run_two(tmp_path, [{**common, "SLURM_PROCID": str(i)} for i in range(2)])
    for r in results:  # task 1 wrote nothing, silently, when it took itself for worker 1 of 2
        assert (r["rank"], r["workers"], r["chief"]) == (0, 1, True)
        assert r["files"] == ["backup", "ckpt.weights.h5"]
    for i in range(2):
        assert os.listdir(tmp_path / f"task{i}" / "backup")
