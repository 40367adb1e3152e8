"""DeviceMetricsLogger with 2 real workers: the chief's record covers both; only it writes.

Each worker stands in 2 GPUs with a `ScriptedSampler` whose numbers say which
worker read them (worker w reads 100 * (w + 1) + k MB at its k-th reading).
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

import keras_mgpu_plugins as kmp

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]

GLOBAL_BATCH = 16
STEPS = 4


def build_model():
    import keras

    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(3)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4)),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def memory(rank, k):
    return 100.0 * (rank + 1) + k


def train_with_metrics(root):
    import contextlib
    import io
    import logging

    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger
    from keras_mgpu_plugins.samplers import ScriptedSampler

    rank = kmp.topology().worker_index
    sampler = ScriptedSampler([
        {"GPU:0": {"memory_mb": memory(rank, k), "utilization_pct": 10.0 * (rank + 1)},
         "GPU:1": {"memory_mb": memory(rank, k) + 1000, "utilization_pct": 10.0 * (rank + 1) + 5}}
        for k in range(4)
    ])
    out = os.path.join(root, f"worker{rank}")  # each worker is told its own place
    logger = DeviceMetricsLogger(  # no batch_size: each worker counts its rows
        log_freq=2, csv_path=os.path.join(out, "metrics.csv"),
        log_dir=os.path.join(out, "tb"), plot=os.path.join(out, "devices.png"),
        sample_interval=None, sampler=sampler,
    )
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("keras_mgpu_plugins").addHandler(handler)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 5)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = kmp.parallelize(build_model)()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0,
                            callbacks=[logger])
    differing = None
    try:  # worker 1 leaves out the batch records: both workers raise, before any collective differs
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0, callbacks=[
            DeviceMetricsLogger(log_freq=2 if rank == 0 else "epoch", summary=False)])
    except kmp.collective.SettingsDifferError as err:
        differing = str(err)
    files = sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs)
    return {"rank": rank, "history": history.history, "printed": printed.getvalue(), "files": files,
            "warnings": [w for w in warnings if "differ" in w], "differing": differing,
            "replicas": model.distribute_strategy.num_replicas_in_sync}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("device_metrics")
    return root, kmp.launch(train_with_metrics, num_workers=2, args=(str(root),), timeout=200)


def test_chief_logs_hold_every_workers_devices_with_their_own_numbers(run):
    _, (chief, other) = run
    assert (chief["rank"], other["rank"], chief["replicas"]) == (0, 1, 2)
    history = chief["history"]
    for rank in (0, 1):
        # readings 1 and 3 are taken at the epochs' ends, 0 and 2 at batch 2
        assert history[f"device/worker{rank}/GPU:0/memory_mb"] == [memory(rank, 1), memory(rank, 3)]
        assert history[f"device/worker{rank}/GPU:1/peak_memory_mb"] == [
            memory(rank, 1) + 1000, memory(rank, 3) + 1000]
        assert history[f"device/worker{rank}/GPU:1/utilization_pct"] == [10.0 * (rank + 1) + 5] * 2
        assert all(v > 0 for v in history[f"host/worker{rank}/memory_mb"])
    assert not any(k.startswith(("device/GPU", "host/memory")) for k in history)  # scoped keys only
    assert history["device/peak_memory_mb_max"] == [memory(1, 1) + 1000, memory(1, 3) + 1000]
    samples = history["throughput/samples_per_sec"]
    assert samples == pytest.approx([GLOBAL_BATCH * s for s in history["throughput/steps_per_sec"]])
    assert history["throughput/samples_per_sec_per_replica"] == pytest.approx([s / 2 for s in samples])


def test_every_worker_holds_the_same_gathered_record(run):
    _, (chief, other) = run
    assert set(chief["history"]) == set(other["history"])
    for key, values in chief["history"].items():
        if key.startswith(("device/", "step_time/", "throughput/", "host/")):
            assert other["history"][key] == values, key


def test_a_worker_configured_otherwise_raises_settings_differ_on_every_worker(run):
    _, (chief, other) = run
    assert chief["warnings"] == other["warnings"] == []
    assert "DeviceMetricsLogger must be created with the same arguments" in chief["differing"]
    assert "log_freq (here 2; differs from the chief's on worker(s) 1)" in chief["differing"]
    assert "log_freq (here 'epoch'; differs from the chief's on worker(s) 1)" in other["differing"]
    assert "plot" not in chief["differing"].split("Differing:")[1]


def test_only_the_chief_writes_files_and_prints(run):
    root, (chief, other) = run
    assert chief["files"][0] == "devices.png" and chief["files"][1] == "metrics.csv"
    assert [f for f in chief["files"] if f.startswith("tb/events.out.tfevents.")]
    assert other["files"] == [] and not (root / "worker1").exists()
    with open(root / "worker0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["epoch"], r["batch"], r["kind"]) for r in rows] == [
        ("0", "2", "batch"), ("0", "4", "epoch"), ("1", "2", "batch"), ("1", "4", "epoch")]
    assert [float(r["device/worker1/GPU:0/memory_mb"]) for r in rows] == [memory(1, k) for k in range(4)]
    assert (root / "worker0" / "devices.png").stat().st_size > 20_000
    lines = chief["printed"].splitlines()
    assert lines[0].startswith("Device metrics over 2 epoch(s)")
    assert [line.split()[:2] for line in lines[2:6]] == [
        ["0", "GPU:0"], ["0", "GPU:1"], ["1", "GPU:0"], ["1", "GPU:1"]]
    assert lines[3].split()[2:4] == [str(memory(0, 3) + 1000), str(memory(0, 3) + 1000)]
    assert other["printed"] == ""


def csv_blocked_on_the_chief(root):
    import logging

    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger
    from keras_mgpu_plugins.samplers import ScriptedSampler

    class LostGPU(ScriptedSampler):
        def sample(self):
            raise RuntimeError("GPU is lost")

    blocker = os.path.join(root, "a_file")
    with open(blocker, "w") as f:
        f.write("not a folder")
    chief = kmp.topology().is_chief
    sampler = (ScriptedSampler if chief else LostGPU)([{"GPU:0": {"memory_mb": 1.0}}])
    logger = DeviceMetricsLogger(  # the chief's folder is a file: its first CSV row fails
        csv_path=os.path.join(blocker if chief else root, "metrics.csv"), summary=False,
        sample_interval=None, sampler=sampler,  # worker 1's readings fail before that record's gather
    )
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("keras_mgpu_plugins").addHandler(handler)
    x = np.ones((GLOBAL_BATCH * STEPS, 5), "float32")
    try:
        kmp.parallelize(build_model)().fit(x, x[:, :1], batch_size=GLOBAL_BATCH, epochs=3,
                                           verbose=0, callbacks=[logger])
    except Exception as err:  # noqa: BLE001 - the test checks what each worker raised
        return f"{type(err).__name__}: {err}", [w for w in warnings if "failed" in w]
    return None, warnings


def test_a_csv_failing_on_the_chief_stops_every_worker_at_that_record(tmp_path):
    (chief, chief_warnings), (other, other_warnings) = kmp.launch(
        csv_blocked_on_the_chief, num_workers=2, args=(str(tmp_path),), timeout=200)
    assert chief.startswith(("NotADirectoryError", "FileExistsError")) and "a_file" in chief
    assert other == (  # with the chief's own error
        f"PeerFailedError: DeviceMetricsLogger: writing a record failed (worker 0: {chief}). "
        "Every worker stops here.")
    assert sorted(os.listdir(tmp_path)) == ["a_file"]  # worker 1 wrote nothing
    # worker 1's sampler raised at that record: NaN readings, it still joined the gather
    assert other_warnings == [
        "DeviceMetricsLogger: reading the devices failed (RuntimeError: GPU is lost); its values are "
        "NaN in the records where a reading fails, and training goes on. Later failures in this fit "
        "are not logged."]
    assert chief_warnings == [
        "DeviceMetricsLogger: reading devices or host failed on worker(s) 1; their values are NaN "
        "where it failed (the error is in that worker's log)."]
