"""strategy="hybrid" with BackupAndRestore (and W&B): worker 1 killed, the job relaunched.

2 workers (kmp.launch) x 2 simulated CPU devices each; the relaunched job resumes at the
interrupted epoch and ends with the weights of one process that was never interrupted.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.launch import WorkerFailedError
from tests.multi_worker.test_hybrid import (
    EPOCHS,
    KILL_EPOCH,
    WANDB,
    job,
    single,  # noqa: F401 (fixture)
    train,
)

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]


def test_killed_worker_then_relaunch_resumes_to_the_same_weights(tmp_path, single):  # noqa: F811
    with pytest.raises(WorkerFailedError) as failure:
        kmp.launch(job, num_workers=2, args=(str(tmp_path),), kwargs={"kill": True},
                   create_strategy=False, timeout=200)
    assert (failure.value.worker_index, failure.value.signal) == (1, "SIGKILL"), failure.value
    with open(tmp_path / "backup" / "training_metadata.json") as f:
        assert json.load(f)["epoch"] == KILL_EPOCH
    wandb_dir = tmp_path / "wandb"
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true",
           "KMP_JOB_ID": None, "WANDB_RUN_GROUP": None, "WANDB_PROJECT": None}
    resumed = kmp.launch(resume, num_workers=2, args=(str(tmp_path), WANDB), env=env,
                         create_strategy=False, timeout=200)
    if WANDB:  # the chief's one run: the resumed epochs, the job as multi-worker
        from keras_mgpu_plugins.integrations._wandb_records import find_runs, read_run

        (run,) = [read_run(path) for path in find_runs(wandb_dir)]
        assert run.finished and run.config["strategy"] == "MultiWorkerMirroredStrategy"
        assert (run.config["num_workers"], run.config["num_replicas"]) == (2, 2)
        epochs = [row for row in run.history if "epoch" in row]
        assert [row["loss"] for row in epochs] == resumed[0]["history"]["loss"]
    for seen in resumed:
        assert seen["epochs"] == list(range(KILL_EPOCH, EPOCHS))
        for a, want in zip(seen["weights"], single["weights"], strict=True):
            assert np.max(np.abs(a - want)) < 1e-5  # momentum restored too
    for a, b in zip(resumed[0]["weights"], resumed[1]["weights"], strict=True):
        assert np.array_equal(a, b)


def resume(out, with_wandb):
    """The relaunched job: the same training, with the W&B logger when installed."""
    kmp.simulate_devices(2)
    extra = []
    if with_wandb:
        from keras_mgpu_plugins.integrations.wandb import WandbLogger

        extra.append(WandbLogger(project="kmp-hybrid", log_checkpoints=False))
    _, seen = train(out, extra=extra)
    return seen
