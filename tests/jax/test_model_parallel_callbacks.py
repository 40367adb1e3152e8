"""kmp's callbacks with sharded variables on JAX: `strategy="model_parallel"` on the 2
simulated devices of this process, `"hybrid"` on 2 processes of 2 devices (`kmp.launch`),
BackupAndRestore in fresh processes (the device count is fixed when JAX starts).

- EarlyStopping(restore_best_weights=True) stops at plain Keras's epoch on one device and
  restores its weights (within 1e-5), each variable back in its layout, also a variable
  sharded over the processes (which `get_weights()` cannot read);
- WeightSyncVerifier compares every copy of every shard, raises on a nudged copy of one
  shard naming it, and raises nothing after normal training;
- BackupAndRestore resumes a killed model-parallel run bit-exact, and a backup of 2
  devices resumes on 1 (within 1e-6 of training on 1 device throughout);
- DeviceMetricsLogger logs the keys it logs under DataParallel, process 0 alone writes its
  CSV with every process's host column, and its throughput counts each global sample once
  and divides by the data replicas (the "batch" axis), not by the devices.
"""

from __future__ import annotations

import csv
import json
import logging
import re
import shutil

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.launch import WorkerFailedError
from tests.jax import helpers
from tests.jax import model_parallel_callbacks_job as job
from tests.jax import model_parallel_job as mp

pytestmark = [pytest.mark.timeout(300)]
TOLERANCE = 1e-5
#: A backup of 2 devices resumed on 1 against 1 device throughout (measured: 4.0e-7).
RESHARDED_TOLERANCE = 1e-6


def launch(fn, processes, *args, n=2, **kwargs):
    return kmp.launch(fn, num_workers=processes, args=args, timeout=200,
                      env=helpers.simulated_devices(n), **kwargs)



@pytest.fixture(scope="module")
def reference():
    """Plain Keras's EarlyStopping on one device."""
    keras.distribution.set_distribution(None)
    model = mp.build(True)
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2,
                                            restore_best_weights=True)
    x, y = mp.data()
    with keras.device("cpu:0"):
        model.fit(x, y, batch_size=mp.BATCH, epochs=job.EPOCHS, shuffle=False, verbose=0,
                  validation_data=job.validation(), callbacks=[stopper])
    found = {"stopped": stopper.stopped_epoch, "best": stopper.best_epoch,
             "weights": model.get_weights()}
    assert (found["stopped"], found["best"]) == (4, 2)  # stops mid-run, restores an earlier epoch
    return found


def assert_restored_as_plain_keras(results: dict, expected: dict) -> None:
    assert (results["stopped"], results["best"]) == (expected["stopped"], expected["best"])
    for index, (got, want) in enumerate(zip(results["weights"], expected["weights"], strict=True)):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0, err_msg=f"weight {index}")


# --- EarlyStopping -----------------------------------------------------------------------

def test_model_parallel_early_stopping_restores_plain_keras_weights_in_their_shards(reference):
    model = kmp.parallelize(mp.build, strategy="model_parallel")(True)
    results = job.early_stopping_fit(model)
    assert_restored_as_plain_keras(results, reference)
    shards = results["shards"]
    assert shards["hidden/kernel"] == [(96, 16)] * 2  # still sharded after the restore
    assert shards["table/embeddings"] == [(16, 16)] * 2
    assert shards["adam/hidden_kernel_momentum"] == [(96, 16)] * 2
    assert shards["hidden/bias"] == [(32,)] * 2  # replicated


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """kmp's layouts: each shard on one device of each process; a DeviceMetricsLogger in the
    EarlyStopping fit, its CSVs in `hybrid[0]["folder"]`."""
    folder = tmp_path_factory.mktemp("hybrid_metrics")
    results = launch(job.hybrid_job, 2, None, str(folder))
    for found in results:
        found["folder"] = folder
    return results


@pytest.fixture(scope="module")
def across():
    """hidden/kernel sharded over the processes too: no process can read it alone."""
    return launch(job.hybrid_job, 2, job.ACROSS_PROCESSES)


@pytest.mark.slow
@pytest.mark.multi_worker
def test_hybrid_early_stopping_restores_plain_keras_weights_in_their_shards(hybrid, reference):
    for results in hybrid:
        assert_restored_as_plain_keras(results, reference)
        assert results["shards"]["hidden/kernel"] == [(96, 16)] * 2


@pytest.mark.slow
@pytest.mark.multi_worker
def test_hybrid_early_stopping_restores_a_variable_sharded_over_the_processes(across, reference):
    for results in across:
        assert_restored_as_plain_keras(results, reference)
        assert results["shards"]["hidden/kernel"] == [(48, 16)] * 2  # a quarter per device
        assert results["shards"]["adam/hidden_kernel_velocity"] == [(48, 16)] * 2


# --- WeightSyncVerifier ------------------------------------------------------------------

def copies_of(checked: dict, path: str) -> int:
    return sum(len(held) for key, held in checked.items() if key.split("[")[0] == path)


@pytest.mark.slow
@pytest.mark.multi_worker
def test_hybrid_weight_sync_checks_every_copy_of_every_shard_without_false_alarm(hybrid):
    for results in hybrid:
        assert results["checks"] == [("train begin", 0)] + [
            (f"end of epoch {e}", 0) for e in range(1, results["stopped"] + 2)]
        checked = results["checked"]
        assert checked["hidden/kernel[:, 0:16]"] == [0] and checked["hidden/kernel[:, 16:32]"] == [1]
        assert checked["table/embeddings[16:32, :]"] == [1]
        assert checked["adam/hidden_kernel_momentum[:, 16:32]"] == [1]
        assert checked["hidden/bias"] == [0, 1]  # replicated: both devices, each process
        for path, held in results["shards"].items():  # every buffer of every variable
            if path not in ("adam/iteration", "adam/learning_rate"):  # scalars: checked too
                assert copies_of(checked, path) == len(held), path


@pytest.mark.slow
@pytest.mark.multi_worker
def test_a_nudged_copy_of_one_shard_raises_on_every_process_naming_it(hybrid):
    messages = {results["nudged"] for results in hybrid}
    assert len(messages) == 1, messages  # the same error on both processes
    message = messages.pop()
    assert message.startswith("Weights out of sync at end of epoch 1: 1 variable(s) differ from "
                              "their first copy"), message
    assert "hidden/kernel[:, 16:32] [model]: worker 1 device 1 (max |diff| 0.001)" in message


@pytest.mark.slow
@pytest.mark.multi_worker
def test_pieces_held_by_one_process_only_are_listed_everywhere_and_raise_nothing(across):
    for rank, results in enumerate(across):
        assert results["checks"][-1] == (f"end of epoch {results['stopped'] + 1}", 0)
        checked = results["checked"]
        mine, other = ("0:48", "48:96") if rank == 0 else ("48:96", "0:48")
        assert checked[f"hidden/kernel[{mine}, 16:32]"] == [1]
        assert checked[f"hidden/kernel[{other}, 16:32]"] == []  # held by the other process


def test_model_parallel_weight_sync_compares_the_replicated_copies(caplog):
    model = kmp.parallelize(mp.build, strategy="model_parallel")(True)
    verifier = kmp.callbacks.WeightSyncVerifier()
    with caplog.at_level(logging.WARNING):
        results = job.early_stopping_fit(model, [verifier])
    assert not [r for r in caplog.records if "nothing to compare" in r.getMessage()]
    checks = [(report.where, len(report.mismatches)) for report in verifier.reports]
    assert checks == [("train begin", 0)] + [(f"end of epoch {e}", 0) for e in range(1, 6)]
    checked = job.checked(verifier)
    assert checked["hidden/kernel[:, 0:16]"] == [0] and checked["hidden/kernel[:, 16:32]"] == [1]
    assert checked["narrow/kernel"] == [0, 1] and checked["hidden/bias"] == [0, 1]
    for path, held in results["shards"].items():
        if path not in ("adam/iteration", "adam/learning_rate"):
            assert copies_of(checked, path) == len(held), path
    keras.distribution.set_distribution(None)
    message = job.nudged_fit("model_parallel", "narrow/kernel", 1)
    assert "narrow/kernel [model]: worker 0 replica 1 (max |diff| 0.001)" in message, message


# --- BackupAndRestore --------------------------------------------------------------------

@pytest.fixture(scope="module")
def backups(tmp_path_factory):
    """Model parallel on 2 devices: uninterrupted; killed in epoch 2 (its backup kept twice)."""
    folder = tmp_path_factory.mktemp("sharded_backup")
    whole = launch(job.backup_job, 1, str(folder / "whole"))[0]
    with pytest.raises(WorkerFailedError) as failure:
        launch(job.backup_job, 1, str(folder / "backup"), kwargs={"kill_epoch": 2})
    assert (failure.value.worker_index, failure.value.signal) == (0, "SIGKILL")
    with open(folder / "backup" / "training_metadata.json") as f:
        assert json.load(f)["epoch"] == 2
    shutil.copytree(folder / "backup", folder / "for_one_device")
    return {"folder": folder, "whole": whole}


@pytest.mark.slow
@pytest.mark.multi_worker
def test_a_killed_model_parallel_run_resumes_bit_exact_in_its_shards(backups):
    resumed = launch(job.backup_job, 1, str(backups["folder"] / "backup"))[0]
    assert backups["whole"]["epochs"] == [0, 1, 2, 3] and resumed["epochs"] == [2, 3]
    for index, (got, want) in enumerate(zip(resumed["weights"], backups["whole"]["weights"],
                                            strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"variable {index}")  # weights and Adam's
    assert resumed["shards"]["hidden/kernel"] == [(96, 16)] * 2
    assert resumed["shards"]["adam/hidden_kernel_velocity"] == [(96, 16)] * 2


@pytest.mark.slow
@pytest.mark.multi_worker
def test_a_backup_of_two_devices_resumes_on_one(backups):
    one = launch(job.backup_job, 1, str(backups["folder"] / "one_whole"), n=1)[0]
    resumed = launch(job.backup_job, 1, str(backups["folder"] / "for_one_device"), n=1)[0]
    assert (one["devices"], resumed["devices"]) == (1, 1)
    assert resumed["epochs"] == [2, 3]
    assert resumed["shards"]["hidden/kernel"] == [(96, 32)]  # the whole on the one device
    for index, (got, want) in enumerate(zip(resumed["weights"], one["weights"], strict=True)):
        np.testing.assert_allclose(got, want, atol=RESHARDED_TOLERANCE, rtol=0,
                                   err_msg=f"variable {index}")


# --- DeviceMetricsLogger -----------------------------------------------------------------

RUN_KEYS = {"step_time/mean_ms", "step_time/p50_ms", "step_time/p95_ms",
            "throughput/steps_per_sec", "throughput/samples_per_sec",
            "throughput/samples_per_sec_per_replica"}


def metric_keys(processes: int) -> set[str]:
    """DeviceMetricsLogger's keys on CPU devices: the run's, the FLOPs/MFU and step phases (and
    on several processes the straggler report), each process's host memory and
    CPU; no `device/` key (JAX's CPU devices report no memory: `memory_stats()` is None)."""
    scopes = [f"worker{rank}/" for rank in range(processes)] if processes > 1 else [""]
    efficiency = {"flops/per_step", "throughput/tflops", "throughput/tflops_per_device",
                  "throughput/tokens_per_sec", "efficiency/mfu_pct"}
    phases = {f"phase/{scope}{phase}_ms" for scope in scopes
              for phase in ("input", "host", "compute")}
    stragglers = ({"straggler/worker", "straggler/phase", "straggler/excess_ms"}
                  if processes > 1 else set())
    return (RUN_KEYS | efficiency | phases | stragglers
            | {f"host/{scope}{field}" for scope in scopes for field in ("memory_mb", "cpu_pct")})


def assert_throughput(logs: dict, replicas: int) -> None:
    """Samples per second: the global batch (`mp.BATCH`) once per step; per replica: that
    over the data replicas."""
    samples = logs["throughput/samples_per_sec"]
    assert samples == pytest.approx(mp.BATCH * logs["throughput/steps_per_sec"], rel=1e-12)
    assert logs["throughput/samples_per_sec_per_replica"] == pytest.approx(samples / replicas,
                                                                            rel=1e-12)


def csv_rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_csv_holds_the_logs(folder, logs: list[dict]) -> None:
    """`metrics-0.csv` alone, one epoch row per epoch, each the epoch's logs (repr'd floats)."""
    assert sorted(p.name for p in folder.iterdir()) == ["metrics-0.csv"]
    rows = csv_rows(folder / "metrics-0.csv")
    assert [row["kind"] for row in rows] == ["epoch"] * len(logs)
    for row, epoch_logs in zip(rows, logs, strict=True):
        assert {k: float(row[k]) for k in epoch_logs} == epoch_logs


def test_model_parallel_device_metrics_count_the_global_batch_once_per_data_replica(tmp_path):
    model = kmp.parallelize(mp.build, strategy="model_parallel")(True)
    data_parallel = kmp.parallelize(mp.build)(True)  # now Keras's global distribution: 2 replicas
    sharded = job.metrics_fit(model, tmp_path / "model_parallel")
    replicated = job.metrics_fit(data_parallel, tmp_path / "data_parallel")
    for found in (sharded, replicated):
        assert [set(logs) for logs in found["logs"]] == [metric_keys(1)] * 2
    assert_throughput(sharded["logs"][-1], replicas=1)  # 2 devices, 1 data replica
    assert_throughput(replicated["logs"][-1], replicas=2)
    assert_csv_holds_the_logs(tmp_path / "model_parallel", sharded["logs"])
    (line,) = sharded["summary"]
    rate = re.search(r"; ([\d.]+) samples/s \(([\d.]+) per replica\)", line)
    assert rate and rate[1] == rate[2], line


@pytest.mark.slow
@pytest.mark.multi_worker
def test_hybrid_device_metrics_hold_every_process_host_and_count_per_data_replica(hybrid):
    chief, other = (results["metrics"] for results in hybrid)
    epochs = hybrid[0]["stopped"] + 1
    assert [set(logs) for logs in chief["logs"]] == [metric_keys(2)] * epochs
    assert other["logs"] == chief["logs"]  # one record, gathered: the same on every process
    assert_throughput(chief["logs"][-1], replicas=2)  # 4 devices, 2 data replicas
    assert_csv_holds_the_logs(hybrid[0]["folder"], chief["logs"])
    (line,) = chief["summary"]
    rate = re.search(r"; ([\d.]+) samples/s \(([\d.]+) per replica\)", line)
    assert rate and float(rate[2]) == pytest.approx(float(rate[1]) / 2, abs=0.1), line
    assert other["summary"] == []  # process 0 alone prints
