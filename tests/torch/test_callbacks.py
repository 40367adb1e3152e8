"""Every kmp callback on torch: 2 real processes (`kmp.launch`: torch's process group, gloo).

One job per layout runs every check that lets it go on (`callbacks_job.main_job`);
BackupAndRestore (a process SIGKILLed, the job relaunched) and StallWatchdog (a
process hangs, the job fails) have their own jobs. Numbers are checked against
plain Keras on one device, on the same global batches (Adam, no shuffle, seeded).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.launch import WorkerFailedError
from tests.torch import callbacks_job as job

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(300)]
TOLERANCE = 1e-5
ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "CUDA_VISIBLE_DEVICES": "",
       "KERAS_BACKEND": "torch", "OMP_NUM_THREADS": "1"}
CHECKPOINTS = ["async.weights.h5", "ckpt-1.keras", "ckpt-2.keras", "ckpt-3.keras"]


def launch(fn, processes, *args, **kwargs):
    return kmp.launch(fn, num_workers=processes, args=args, timeout=250, env=ENV, **kwargs)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torch_callbacks")
    return {"folder": folder, "processes": 2, "results": launch(job.main_job, 2, str(folder))}


@pytest.fixture(scope="module")
def reference():
    return job.reference_weights()


def test_every_process_ran_in_the_process_group(run):
    for rank, results in enumerate(run["results"]):
        assert (results["rank"], results["processes"]) == (rank, 2)


def test_process_0_alone_writes_each_checkpoint_atomically(run):
    chief, *others = run["results"]
    assert chief["writes"] == CHECKPOINTS
    assert all(other["writes"] == [] for other in others)
    assert sorted(p for p in os.listdir(run["folder"]) if not p.startswith(("wandb", "metrics"))) \
        == CHECKPOINTS  # no temporary left beside them


def test_keras_checkpoint_loads_in_plain_keras_with_the_trained_weights(run, reference):
    import keras

    loaded = keras.saving.load_model(run["folder"] / "ckpt-3.keras").get_weights()
    from_async = job.build()
    from_async.load_weights(run["folder"] / "async.weights.h5")
    for results in run["results"]:
        for saved, trained in zip(loaded, results["weights"], strict=True):
            np.testing.assert_array_equal(saved, trained)
        for saved, trained in zip(from_async.get_weights(), results["weights"], strict=True):
            np.testing.assert_array_equal(saved, trained)
    for saved, expected in zip(loaded, reference, strict=True):
        np.testing.assert_allclose(saved, expected, atol=TOLERANCE, rtol=0)


def test_early_stopping_stops_every_process_at_the_chiefs_epoch_with_the_best_weights(run):
    for results in run["results"]:
        assert results["es_epochs"] == [0, 1, 2, 3] and results["es_stopped"] == 3
        for restored, best in zip(results["es_weights"], results["es_best_epoch_weights"],
                                  strict=True):
            np.testing.assert_array_equal(restored, best)  # the weights of epoch 1 (index 1)
    chief = run["results"][0]
    for other in run["results"][1:]:
        for a, b in zip(other["es_weights"], chief["es_weights"], strict=True):
            np.testing.assert_array_equal(a, b)


def test_weight_sync_checks_every_process_copy_without_false_alarm(run):
    for results in run["results"]:
        assert results["replicas"] == 1  # one device per process: the processes are compared
        assert results["checks"] == [("train begin", 0)] + [
            (f"end of epoch {e}", 0) for e in (1, 2, 3)]
        assert "sequential/dense/kernel" in results["checked"]
        assert "adam/sequential_dense_kernel_momentum" in results["checked"]


def test_batchnorm_statistics_stay_identical_across_processes(run):
    """Upstream's DDP fit leaves each process its own moving statistics; kmp keeps rank 0's
    on every process (as DDP broadcasts its buffers), so nothing differs."""
    for results in run["results"]:
        assert results["bn_checks"] == [("train begin", 0), ("end of epoch 1", 0),
                                        ("end of epoch 2", 0)]
    for a, b in zip(run["results"][0]["bn_weights"], run["results"][1]["bn_weights"],
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_nudged_copy_raises_on_every_process_naming_variable_and_process(run):
    messages = {results["sync_error"] for results in run["results"]}
    assert len(messages) == 1  # the same error everywhere
    message = messages.pop()
    assert message.startswith("Weights out of sync at end of epoch 1: 1 variable(s) differ")
    assert re.search(r"dense_\d+/kernel \[model\]: worker 1 replica 0 \(max \|diff\| 0.001\)",
                     message), message


def test_device_metrics_hold_every_process_host_step_time_and_throughput(run):
    for results in run["results"]:
        keys = results["log_keys"]
        hosts = ([f"host/worker{rank}/memory_mb" for rank in range(run["processes"])]
                 if run["processes"] > 1 else ["host/memory_mb"])
        assert set(hosts) <= set(keys)
        assert {"step_time/mean_ms", "throughput/samples_per_sec",
                "throughput/samples_per_sec_per_replica"} <= set(keys)
    with open(run["folder"] / "metrics.csv") as f:
        header, *rows = [line.split(",") for line in f.read().splitlines()]
    assert rows and set(hosts) <= set(header)


def test_wandb_makes_one_run_per_job(run):
    from keras_mgpu_plugins.integrations._wandb_records import find_runs, read_run

    (folder,) = find_runs(run["folder"])
    record = read_run(folder)
    assert record.finished and record.project == "kmp-torch"
    assert record.config["num_workers"] == run["processes"]
    assert [row["epoch"] for row in record.history if "epoch" in row] == [0, 1, 2]
    losses = [row["loss"] for row in record.history if "epoch" in row]
    np.testing.assert_allclose(losses, run["results"][0]["loss"], rtol=0, atol=1e-7)


def test_kmp_callbacks_given_on_process_0_only_raise_everywhere(run):
    for rank, results in enumerate(run["results"]):
        assert results["differ_error"].startswith(
            "model.fit was given different kmp callbacks on different workers: here "
            f"(worker {rank}) {['ModelCheckpoint'] if rank == 0 else []}"), results["differ_error"]


def test_multi_gpu_model_names_parallelize(run):
    message = run["results"][0]["multi_gpu_error"]
    assert "needs the TensorFlow backend; the Keras backend here is 'torch'" in message
    assert "@kmp.parallelize" in message


def test_a_killed_process_then_relaunch_resumes_a_shuffled_fit_bit_exact(tmp_path):
    uninterrupted = launch(job.backup_job, 2, str(tmp_path / "whole"))
    assert uninterrupted[0]["epochs"] == [0, 1, 2, 3, 4]
    assert not os.path.exists(tmp_path / "whole")  # deleted by process 0 at the end
    backup = tmp_path / "backup"
    with pytest.raises(WorkerFailedError) as failure:
        launch(job.backup_job, 2, str(backup), kwargs={"kill_epoch": 2})
    assert (failure.value.worker_index, failure.value.signal) == (1, "SIGKILL")
    assert sorted(os.listdir(backup)) == ["latest.weights.h5", "training_metadata.json"]
    with open(backup / "training_metadata.json") as f:
        assert json.load(f)["epoch"] == 2
    resumed = launch(job.backup_job, 2, str(backup), kwargs={"seed": 9})
    for results in resumed:
        assert results["epochs"] == [2, 3, 4]
        for a, b in zip(results["weights"], uninterrupted[0]["weights"], strict=True):
            np.testing.assert_array_equal(a, b)
    for runs in (uninterrupted, resumed):
        assert runs[0]["writes"] == ["latest.weights.h5", "training_metadata.json"]
        assert runs[1]["writes"] == []


def test_a_hung_process_fails_the_job_with_every_process_stack(tmp_path):
    with pytest.raises(WorkerFailedError) as failure:
        launch(job.stall_job, 2, 8, log_dir=str(tmp_path))
    text = str(failure.value)
    assert "stopped by StallWatchdog (exit code 70)" in text
    assert "no worker made progress for 8 seconds (timeout=8); stuck: worker 1" in text
    logs = {int(m.group(1)): (tmp_path / name).read_text() for name in os.listdir(tmp_path)
            if (m := re.fullmatch(r"worker-(\d)\.log", name))}
    assert sorted(logs) == [0, 1]
    for rank, log in logs.items():
        assert f"StallWatchdog: Python stacks of worker {rank} of 2" in log
        assert re.search(r"worker 0: waiting inside torch at .*called from stall_job", log), log
        assert re.search(r"worker 1: stuck in sleep_forever_in_epoch_end", log)
    assert re.search(r'File ".*callbacks_job.py", line \d+ in sleep_forever_in_epoch_end', logs[1])
