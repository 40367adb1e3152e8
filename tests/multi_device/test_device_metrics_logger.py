"""DeviceMetricsLogger in real `fit`s: one device, 2 logical devices, scripted GPUs.

The machine has no GPU: the real samplers report the host (and no GPU keys),
and GPUs are stood in for by a `ScriptedSampler` behind the sampler interface.
"""

from __future__ import annotations

import csv
import glob
import logging

import keras
import numpy as np
import psutil
import pytest
import tensorflow as tf

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import _device_metrics_end, events
from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger
from keras_mgpu_plugins.samplers import ScriptedSampler

BATCH = 16
STEPS = 4  # per epoch
RUN_KEYS = {
    "step_time/mean_ms", "step_time/p50_ms", "step_time/p95_ms", "throughput/steps_per_sec",
    "throughput/samples_per_sec", "throughput/samples_per_sec_per_replica",
    # counted FLOPs, MFU against the CPU's measured peak, the step's phases (docs/efficiency.md)
    "flops/per_step", "throughput/tflops", "throughput/tflops_per_device", "efficiency/mfu_pct",
    "phase/input_ms", "phase/host_ms", "phase/compute_ms",
}
TF_HOST_KEYS = {"host/tf_memory_mb", "host/tf_peak_memory_mb"}


def tf_reports_host_memory() -> bool:
    """Whether TensorFlow keeps host allocator statistics in this process.

    TensorFlow 2.21's default CPU allocator keeps none ("Allocator stats not
    available"); its BFC allocator (`TF_CPU_ALLOCATOR_USE_BFC=true`) does.
    """
    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:
        return False
    return True


HOST_KEYS = {"host/memory_mb", "host/cpu_pct"} | (TF_HOST_KEYS if tf_reports_host_memory() else set())


def tiny_model():
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(1)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2)),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, 6)).astype("float32")
    return x, (x @ rng.normal(size=(6, 1))).astype("float32")


def fit(callbacks, model=None, epochs=2, verbose=0, **kwargs):
    x, y = data()
    model = model or tiny_model()
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=verbose,
                        callbacks=callbacks, **kwargs)
    return history.history


def two_gpus(memory, util):
    """One reading per entry: GPU:1 reads GPU:0's numbers + 1000 MB, + 1 %."""
    return ScriptedSampler([
        {"GPU:0": {"memory_mb": m, "utilization_pct": u, "power_w": 100.0 + u, "temperature_c": 50.0 + u},
         "GPU:1": {"memory_mb": m + 1000, "utilization_pct": u + 1, "power_w": 101.0 + u,
                   "temperature_c": 51.0 + u}}
        for m, u in zip(memory, util, strict=True)
    ])


def test_one_device_without_gpu_reports_host_and_run_and_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(_device_metrics_end, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="keras_mgpu_plugins"):
        history = fit([DeviceMetricsLogger(batch_size=BATCH, summary=False)])
        fit([DeviceMetricsLogger(batch_size=BATCH, summary=False)], epochs=1)
    assert set(history) == {"loss"} | RUN_KEYS | HOST_KEYS  # no device/ key without a GPU
    assert [r.getMessage() for r in caplog.records if "GPU" in r.getMessage()] == [
        "DeviceMetricsLogger: no GPU found; GPU metrics unavailable, reporting host metrics only."
    ]
    rss = psutil.Process().memory_info().rss / 2**20
    assert history["host/memory_mb"][-1] == pytest.approx(rss, rel=0.25)
    assert all(v >= 0 for v in history["host/cpu_pct"] + history.get("host/tf_memory_mb", []))
    for e in range(2):
        assert 0 < history["step_time/p50_ms"][e] <= history["step_time/p95_ms"][e]
        per_sec = history["throughput/steps_per_sec"][e]
        assert history["step_time/mean_ms"][e] == pytest.approx(1000 / per_sec)
        assert history["throughput/samples_per_sec"][e] == pytest.approx(BATCH * per_sec)
        assert history["throughput/samples_per_sec_per_replica"][e] == pytest.approx(BATCH * per_sec)


def test_real_gpu_sampler_on_faked_gpus_without_nvml_gives_memory_keys_and_one_warning(monkeypatch, caplog):
    from keras_mgpu_plugins.samplers import GPUSampler
    from tests.unit.test_gpu_sampler import fake_gpu_machine, fake_tensorflow

    fake_tf = fake_tensorflow([1, 1], {"GPU:0": (3 << 19, 5 << 20), "GPU:1": (1 << 30, 1 << 31)})
    with fake_gpu_machine(monkeypatch, fake_tf, None):  # TensorFlow with 2 GPUs, no nvidia-ml-py
        samplers = [GPUSampler(), GPUSampler()]
    monkeypatch.setattr(_device_metrics_end, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="keras_mgpu_plugins"):
        history = fit([DeviceMetricsLogger(sample_interval=None, sampler=samplers[0], summary=False)])
        fit([DeviceMetricsLogger(sample_interval=None, sampler=samplers[1], summary=False)], epochs=1)
    assert [r.getMessage() for r in caplog.records if "GPU" in r.getMessage()] == [
        "DeviceMetricsLogger: GPU utilisation, power and temperature unavailable: nvidia-ml-py "
        "is not installed (pip install 'keras_mgpu_plugins[nvml]')."]
    assert {k for k in history if k.startswith("device/")} == {
        "device/GPU:0/memory_mb", "device/GPU:0/peak_memory_mb", "device/GPU:1/memory_mb",
        "device/GPU:1/peak_memory_mb", "device/peak_memory_mb_max"}
    assert history["device/GPU:0/memory_mb"] == [1.5, 1.5]  # MiB
    assert history["device/GPU:1/peak_memory_mb"] == history["device/peak_memory_mb_max"] == [2048.0] * 2
    assert fake_tf.resets == ["GPU:0", "GPU:1"] * 3  # at each epoch's start, both fits


def test_two_logical_devices_divide_throughput_per_replica():
    model = kmp.parallelize(strategy="mirrored")(tiny_model)()
    assert model.distribute_strategy.num_replicas_in_sync == 2
    logger = DeviceMetricsLogger(summary=False)  # the batch size is counted, not given
    history = fit([logger], model=model)
    assert set(history) == {"loss"} | RUN_KEYS | HOST_KEYS  # logical CPUs share the host
    for e in range(2):
        total = history["throughput/samples_per_sec"][e]
        assert total == pytest.approx(BATCH * history["throughput/steps_per_sec"][e])
        assert history["throughput/samples_per_sec_per_replica"][e] == pytest.approx(total / 2)
    assert len(logger.records) == 2 and logger.records[0][0].devices == {}


def test_scripted_gpus_give_per_device_keys_and_peak_restarts_each_epoch():
    # one reading at the batch-2 record and one at each epoch's end
    sampler = two_gpus(memory=[300.0, 100.0, 150.0, 120.0], util=[40.0, 60.0, 10.0, 30.0])
    logger = DeviceMetricsLogger(log_freq=2, sample_interval=None, sampler=sampler, summary=False)
    history = fit([logger])
    assert (sampler.calls, sampler.resets) == (4, 2)
    assert history["device/GPU:0/memory_mb"] == [100.0, 120.0]  # at the epoch's end
    assert history["device/GPU:0/peak_memory_mb"] == [300.0, 150.0]  # not 300 again: reset
    assert history["device/GPU:1/peak_memory_mb"] == [1300.0, 1150.0]
    assert history["device/GPU:0/utilization_pct"] == [50.0, 20.0]  # mean over the epoch
    assert history["device/GPU:1/power_w"] == [151.0, 121.0]
    assert history["device/GPU:0/temperature_c"] == [110.0, 80.0]  # highest
    assert history["device/peak_memory_mb_max"] == [1300.0, 1150.0]
    assert history["device/utilization_pct_mean"] == [50.5, 20.5]
    assert not any("worker" in k for k in history)


class ReadAtEpochEnd(keras.callbacks.Callback):
    """Takes a background reading at each epoch's end, after the logger's record.

    What the sampler thread does when its interval falls during a later
    callback's epoch-end work (a checkpoint save), before the next epoch's reset.
    """

    def __init__(self, logger):
        super().__init__()
        self.logger = logger

    def on_epoch_end(self, epoch, logs=None):
        self.logger._thread.sample_now()  # the thread's own call, forced at this point


def test_a_reading_between_the_record_and_the_reset_does_not_carry_the_peak_over():
    # readings: epoch 0's record (peak 500), the forced one after it (memory 100, peak
    # still 500: not reset yet), epoch 1's record (peak 120 since the reset at 100)
    sampler = ScriptedSampler([{"GPU:0": {"memory_mb": m}} for m in (500.0, 100.0, 120.0, 120.0)])
    logger = DeviceMetricsLogger(sample_interval=3600.0, sampler=sampler, summary=False)
    history = fit([logger, ReadAtEpochEnd(logger)])
    assert (sampler.calls, sampler.resets) == (4, 2)
    assert history["device/GPU:0/peak_memory_mb"] == [500.0, 120.0]  # not 500 again
    assert history["device/peak_memory_mb_max"] == [500.0, 120.0]
    assert history["device/GPU:0/memory_mb"] == [500.0, 120.0]
    times, values = logger._thread.series()
    assert len(times) == 4  # the dropped reading still belongs to the run's series


class FailingSampler(ScriptedSampler):
    """A `ScriptedSampler` whose `sample()` raises at the given calls (0-based)."""

    def __init__(self, readings, fail_at):
        super().__init__(readings)
        self.fail_at, self.attempts = set(fail_at), 0

    def sample(self):
        self.attempts += 1
        if self.attempts - 1 in self.fail_at:
            raise RuntimeError("NVML: GPU is lost")
        return super().sample()


def test_a_failing_read_at_a_record_gives_nan_for_the_devices_and_one_warning(caplog):
    # epoch 0's record and epoch 2's fail; epoch 1's reads 120 MB
    sampler = FailingSampler([{"GPU:0": {"memory_mb": 120.0, "utilization_pct": 30.0}}], fail_at={0, 2})
    logger = DeviceMetricsLogger(sample_interval=None, sampler=sampler, summary=False)
    with caplog.at_level(logging.WARNING, logger="keras_mgpu_plugins"):
        history = fit([logger], epochs=3)  # training goes on
    assert len(history["loss"]) == 3
    memory = history["device/GPU:0/memory_mb"]  # kept although the first record had none
    assert np.isnan(memory[0]) and memory[1] == 120.0 and np.isnan(memory[2])
    assert np.isnan(history["device/utilization_pct_mean"][0]) and history["device/GPU:0/utilization_pct"][1] == 30.0
    assert all(v > 0 for v in history["host/memory_mb"])  # the host was read every time
    assert "device/GPU:0/power_w" in history and np.isnan(history["device/GPU:0/power_w"]).all()
    assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == [
        "DeviceMetricsLogger: reading the devices failed (RuntimeError: NVML: GPU is lost); its values "
        "are NaN in the records where a reading fails, and training goes on. Later failures in this "
        "fit are not logged."]
    assert [w[0].run["failed_reads"] for w in logger.records] == [1.0, 0.0, 1.0]


def test_step_times_match_numpy_on_a_scripted_clock():
    starts = [0.0, 1.0, 1.010, 1.030, 5.0, 5.020, 5.025, 5.065]  # 2 epochs x 4 batch starts
    logger = DeviceMetricsLogger(batch_size=BATCH, sample_interval=None, summary=False)
    logger._timer.clock = iter(starts).__next__
    history = fit([logger])
    epochs = [np.array([0.010, 0.020]), np.array([0.020, 0.005, 0.040])]  # 1st interval: tracing
    for e, seconds in enumerate(epochs):
        assert history["step_time/mean_ms"][e] == pytest.approx(1000 * seconds.mean())
        assert history["step_time/p50_ms"][e] == pytest.approx(1000 * np.percentile(seconds, 50))
        assert history["step_time/p95_ms"][e] == pytest.approx(1000 * np.percentile(seconds, 95))
        assert history["throughput/samples_per_sec"][e] == pytest.approx(BATCH * len(seconds) / seconds.sum())


def test_csv_file_has_a_row_per_record(tmp_path):
    path = tmp_path / "metrics.csv"
    sampler = two_gpus(memory=[300.0, 100.0, 150.0, 120.0], util=[40.0, 60.0, 10.0, 30.0])
    logger = DeviceMetricsLogger(log_freq=2, csv_path=str(path), sample_interval=None,
                                 sampler=sampler, summary=False)
    history = fit([logger])
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["epoch"], r["batch"], r["kind"]) for r in rows] == [
        ("0", "2", "batch"), ("0", "4", "epoch"), ("1", "2", "batch"), ("1", "4", "epoch"),
    ]
    assert [float(r["device/GPU:0/memory_mb"]) for r in rows] == [300.0, 100.0, 150.0, 120.0]
    epoch_rows = [r for r in rows if r["kind"] == "epoch"]
    for key in ("device/GPU:1/peak_memory_mb", "host/memory_mb", "step_time/p95_ms"):
        assert [float(r[key]) for r in epoch_rows] == history[key]  # exactly what logs hold
    first = rows[0]  # after batches 0 and 1: one interval (batch 0's, tracing, is not timed)
    assert float(first["step_time/mean_ms"]) == float(first["step_time/p50_ms"]) == float(first["step_time/p95_ms"])
    assert all(float(r["time_s"]) >= 0 for r in rows)


def read_events(log_dir):
    from tensorflow.core.util import event_pb2

    values = {}
    for path in glob.glob(f"{log_dir}/events.out.tfevents.*"):
        for raw in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(raw.numpy())
            for value in event.summary.value:
                values.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return values


def test_tensorboard_event_file_holds_each_record_at_its_global_step(tmp_path):
    sampler = two_gpus(memory=[300.0, 100.0, 150.0, 120.0], util=[40.0, 60.0, 10.0, 30.0])
    logger = DeviceMetricsLogger(log_freq=2, log_dir=str(tmp_path / "tb"), sample_interval=None,
                                 sampler=sampler, summary=False)
    history = fit([logger])
    values = read_events(tmp_path / "tb")
    assert values["device/GPU:0/memory_mb"] == [(2, 300.0), (4, 100.0), (6, 150.0), (8, 120.0)]
    assert [v for _, v in values["host/memory_mb"]][1::2] == pytest.approx(history["host/memory_mb"])


def test_summary_table_is_printed_at_the_end(capsys):
    sampler = two_gpus(memory=[300.0, 100.0, 150.0, 120.0], util=[40.0, 60.0, 10.0, 30.0])
    fit([DeviceMetricsLogger(batch_size=BATCH, log_freq=2, sample_interval=None, sampler=sampler)])
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Device metrics over 2 epoch(s)"))
    assert "samples/s" in lines[start] and "per replica" in lines[start]
    # memory at the end, highest peak, mean utilisation / power, highest temperature
    assert lines[start + 2].split() == ["0", "GPU:0", "120.0", "300.0", "35.0", "135.0", "110.0"]
    assert lines[start + 3].split() == ["0", "GPU:1", "1120.0", "1300.0", "36.0", "136.0", "111.0"]
    assert lines[start + 5].split()[:2] == ["0", "host"]
    fit([DeviceMetricsLogger(summary=False, sampler=two_gpus([1.0], [1.0]))], epochs=1)
    assert "Device metrics over" not in capsys.readouterr().out


def test_plot_is_a_non_trivial_png(tmp_path):
    import matplotlib.image

    path = tmp_path / "plots" / "devices.png"
    readings = [100.0 + 10 * i for i in range(40)]
    sampler = two_gpus(memory=readings, util=[(7 * i) % 100 for i in range(40)])
    fit([DeviceMetricsLogger(plot=str(path), sample_interval=0.02, sampler=sampler, summary=False)], epochs=2)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[0] >= 500 and image.shape[1] >= 900
    colors = np.unique((image[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colors) > 50  # lines, text, legend: not a blank canvas


def test_progbar_shows_only_aggregates_while_later_callbacks_get_every_key(tmp_path, capsys):
    readings = [{f"GPU:{i}": {"memory_mb": 100.0 * i, "utilization_pct": 50.0} for i in range(8)}]
    logger = DeviceMetricsLogger(batch_size=BATCH, sample_interval=None, sampler=ScriptedSampler(readings),
                                 summary=False)
    csv_path = tmp_path / "history.csv"
    history = fit([logger, keras.callbacks.CSVLogger(str(csv_path))], verbose=2)
    out = capsys.readouterr().out
    epoch_lines = [line for line in out.splitlines() if "loss:" in line]
    assert len(epoch_lines) == 2
    for line in epoch_lines:
        assert "step_time/mean_ms" in line and "throughput/samples_per_sec:" in line
        assert "device/peak_memory_mb_max: 700.0000" in line
        assert "device/GPU:" not in line and "host/" not in line
    with open(csv_path, newline="") as f:
        header = next(csv.reader(f))
    assert "device/GPU:7/memory_mb" in header and "host/memory_mb" in header
    assert history["device/GPU:7/memory_mb"] == [700.0, 700.0]
    # with progbar="all", the progress bar shows them too
    fit([DeviceMetricsLogger(progbar="all", sample_interval=None, sampler=ScriptedSampler(readings),
                             summary=False)], epochs=1, verbose=2)
    assert "device/GPU:7/memory_mb: 700.0000" in capsys.readouterr().out


def test_events_carry_every_record():
    model = tiny_model()
    payloads = []
    events.subscribe(model, "device_metrics", payloads.append)
    sampler = two_gpus(memory=[300.0, 100.0, 150.0, 120.0], util=[40.0, 60.0, 10.0, 30.0])
    history = fit([DeviceMetricsLogger(log_freq=2, sample_interval=None, sampler=sampler,
                                       summary=False)], model=model)
    assert [(p["epoch"], p["batch"]) for p in payloads] == [(0, 2), (0, None), (1, 2), (1, None)]
    assert [p["metrics"]["device/GPU:0/memory_mb"] for p in payloads] == [300.0, 100.0, 150.0, 120.0]
    for p, e in zip(payloads[1::2], range(2), strict=True):
        assert p["metrics"] == {k: history[k][e] for k in p["metrics"]}


def test_batch_end_hooks_stay_default_so_keras_may_dispatch_them_async():
    base = keras.callbacks.Callback
    for hook in ("on_batch_end", "on_train_batch_end", "on_test_batch_end", "on_predict_batch_end"):
        assert getattr(DeviceMetricsLogger, hook) is getattr(base, hook), hook


def test_the_same_logger_serves_two_fits_and_restores_history():
    logger = DeviceMetricsLogger(sample_interval=0.01, sampler=two_gpus([1.0], [1.0]), summary=False)
    model = tiny_model()
    fit([logger], model=model, epochs=2)
    assert "on_epoch_end" not in vars(model.history)  # Keras's History is left as found
    history = fit([logger], model=model, epochs=1)
    assert len(logger.records) == 1 and history["device/GPU:1/memory_mb"] == [1001.0]
    assert not logger._thread._thread  # the sampler thread stopped


def test_tensorflow_memory_info_on_cpu_is_one_shared_host_allocator():
    """Why logical CPU devices get no per-device memory keys (reported once, as host/tf_*)."""
    from keras_mgpu_plugins.samplers import HostSampler

    sampler = HostSampler()
    try:
        cpu0 = tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:  # TensorFlow versions that support GPU and TPU only
        assert np.isnan(sampler.sample()["tf_memory_mb"])
        return
    assert tf.config.experimental.get_memory_info("CPU:1") == cpu0  # the same allocator
    before = sampler.sample()["tf_memory_mb"]
    with tf.device("CPU:1"):
        held = tf.ones((1024, 1024))  # 4 MB
    assert sampler.sample()["tf_memory_mb"] - before == pytest.approx(4.0, abs=0.5)
    del held


HOST_TF_SCRIPT = """
import json, keras, numpy as np, tensorflow as tf
import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import DeviceMetricsLogger
kmp.simulate_devices(2)
held = tf.ones((4 * 1024, 1024))  # 16 MB held by TensorFlow's host allocator through the fit
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
history = model.fit(np.ones((64, 6), "float32"), np.ones((64, 1), "float32"), batch_size=16,
                    epochs=2, verbose=0, callbacks=[DeviceMetricsLogger(summary=False)])
print(json.dumps({k: v for k, v in history.history.items() if k.startswith("host/tf_")}))
"""


def test_host_allocator_keys_where_tensorflow_keeps_statistics(tmp_path):
    """TF's BFC host allocator keeps statistics: then host/tf_* appear, at least what is held."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", HOST_TF_SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    keys = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(keys) == TF_HOST_KEYS
    for epoch in range(2):
        assert 16 <= keys["host/tf_memory_mb"][epoch] <= keys["host/tf_peak_memory_mb"][epoch]
