"""WandbLogger in 2 real workers (kmp.launch), wandb offline; the runs are read back from files.

This module imports no `wandb` at import time: the workers import it (by reference,
through cloudpickle), and the chief-mode test checks that worker 1 never imports it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.integrations._wandb_records import find_runs, read_run

pytestmark = [
    pytest.mark.multi_worker,
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb"),
]

ROWS, GLOBAL_BATCH, EPOCHS = 32, 8, 2
SENTINEL = "kmpsentinel0123456789abcdef0123456789abcdef"  # a fake W&B API key
STEPS = ROWS // GLOBAL_BATCH


def build_model():
    import keras

    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(1))]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


def train(out_dir, mode):
    """One tiny fit on this worker, with a kmp checkpoint and the logger."""
    import sys

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger
    from keras_mgpu_plugins.callbacks.model_checkpoint import ModelCheckpoint
    from keras_mgpu_plugins.integrations.wandb import WandbLogger

    if mode == "group":
        # As on a TF_CONFIG or SLURM cluster, where no launcher shares a job id: the
        # chief draws the group and broadcasts it (KMP_JOB_ID: test_wandb_logger.py).
        # The chief alone has a job id here: the workers still take part in the same
        # collectives, and the drawn group wins.
        os.environ.pop("KMP_JOB_ID", None)
        if kmp.topology().is_chief:
            os.environ["KMP_JOB_ID"] = "chief-only"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32")
    model = kmp.parallelize(build_model)()
    callbacks = [
        WandbLogger(project="kmp-mw", name="exp", mode=mode, config={"lr": 0.1}, log_freq=2),
        ModelCheckpoint(os.path.join(out_dir, "best.keras"), monitor="loss", save_best_only=True),
        DeviceMetricsLogger(summary=False),
    ]
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=callbacks)
    imported = "wandb" in sys.modules
    failure = None
    if mode == "chief":  # wandb.init fails on the chief only: every worker must stop at once
        try:
            model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
                      callbacks=[WandbLogger(project="bad/name")])
        except Exception as err:  # noqa: BLE001 - returned for the test to check
            failure = f"{type(err).__name__}: {err}"
    return {"imported_wandb": imported, "history": history.history, "failure": failure}


def run_job(tmp_path, mode):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
           "WANDB_API_KEY": SENTINEL,
           "KMP_JOB_ID": None, "WANDB_RUN_GROUP": None, "WANDB_PROJECT": None}
    results = kmp.launch(train, num_workers=2, args=(str(tmp_path), mode), timeout=200, env=env)
    return results, [read_run(path) for path in find_runs(tmp_path)]


def b64_md5(path):
    return base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode()


@pytest.fixture(scope="module")
def chief_job(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("chief")
    return tmp_path, *run_job(tmp_path, "chief")


@pytest.fixture(scope="module")
def group_job(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("group")
    return tmp_path, *run_job(tmp_path, "group")


def test_chief_mode_makes_one_run_and_worker_1_never_imports_wandb(chief_job):
    _, results, runs = chief_job
    assert [r["imported_wandb"] for r in results] == [True, False]
    assert len(runs) == 1
    run = runs[0]
    assert run.finished and run.project == "kmp-mw" and run.name == "exp"


def test_a_failed_init_on_the_chief_stops_every_worker_instead_of_hanging(chief_job):
    chief, other = (r["failure"] for r in chief_job[1])
    assert chief.startswith("UsageError: Invalid project name 'bad/name'")
    assert other.startswith("PeerFailedError: WandbLogger: wandb.init failed (worker 0: "
                            "UsageError: Invalid project name 'bad/name'")  # the chief's cause


def test_chief_mode_records_the_job_config(chief_job):
    config = chief_job[2][0].config
    assert config["strategy"] == "MultiWorkerMirroredStrategy"
    assert (config["num_workers"], config["num_replicas"]) == (2, 2)
    assert (config["global_batch_size"], config["per_replica_batch_size"]) == (GLOBAL_BATCH, GLOBAL_BATCH // 2)
    assert config["lr"] == 0.1 and len(config["devices"]) == 1  # the chief's own device
    assert "worker_index" not in config


def test_chief_mode_logs_epochs_batches_and_checkpoints(chief_job):
    tmp_path, results, (run,) = chief_job
    history = results[0]["history"]
    assert results[1]["history"] == history
    epochs = [row for row in run.history if "epoch" in row]
    assert [(row["_step"], row["epoch"]) for row in epochs] == [(STEPS, 0), (2 * STEPS, 1)]
    assert [row["loss"] for row in epochs] == history["loss"]
    assert [row["_step"] for row in run.history if "batch/loss" in row] == [2, 4, 6, 8]
    arts = run.artifacts
    assert [(a["name"], a["type"]) for a in arts] == [(f"model-{run.id}", "model")] * EPOCHS
    assert [a["aliases"] for a in arts] == [["best", "epoch-1", "latest"], ["best", "epoch-2", "latest"]]
    assert arts[-1]["files"] == {"best.keras": b64_md5(tmp_path / "best.keras")}


def test_chief_run_holds_every_workers_device_metrics(chief_job):
    (run,) = chief_job[2]
    for row in [row for row in run.history if "epoch" in row]:
        assert row["host/worker0/memory_mb"] > 0 and row["host/worker1/memory_mb"] > 0


def test_group_mode_makes_one_named_run_per_worker_in_one_group(group_job):
    _, results, runs = group_job
    assert [r["imported_wandb"] for r in results] == [True, True]
    assert sorted(run.name for run in runs) == ["exp-worker0", "exp-worker1"]
    groups = {run.group for run in runs}
    assert len(groups) == 1 and groups.pop().startswith("kmp-")  # drawn by the chief, broadcast
    by_name = {run.name: run for run in runs}
    for index in (0, 1):
        run = by_name[f"exp-worker{index}"]
        assert run.finished and run.config["worker_index"] == index
        assert run.config["num_workers"] == 2
        assert [row["loss"] for row in run.history if "epoch" in row] == results[index]["history"]["loss"]
    assert len(by_name["exp-worker0"].artifacts) == EPOCHS  # checkpoints: the chief's run only
    assert by_name["exp-worker1"].artifacts == []


def test_group_mode_each_run_holds_every_workers_device_metrics(group_job):
    """DeviceMetricsLogger is in the fit: worker 1's run holds worker 0's devices too, and the reverse."""
    _, _, runs = group_job
    assert len(runs) == 2
    for run in runs:
        epochs = [row for row in run.history if "epoch" in row]
        assert [(row["_step"], row["epoch"]) for row in epochs] == [(STEPS, 0), (2 * STEPS, 1)]
        for row in epochs:
            assert row["host/worker0/memory_mb"] > 0 and row["host/worker1/memory_mb"] > 0, run.name


def test_the_api_key_is_in_no_file_of_either_job(chief_job, group_job):
    files = [p for job in (chief_job, group_job) for p in job[0].rglob("*") if p.is_file()]
    assert len(files) > 10
    assert [str(p) for p in files if SENTINEL.encode() in p.read_bytes()] == []
