"""Pure logic of DeviceMetricsLogger, tested with numbers (no training)."""

from __future__ import annotations

import csv
import itertools
import logging
import math
import threading
import time

import numpy as np
import pytest

from keras_mgpu_plugins.samplers import (
    DEVICE_FIELDS,
    HOST_FIELDS,
    DeviceSampler,
    GPUSampler,
    HostSampler,
    SamplerThread,
    ScriptedSampler,
)
from keras_mgpu_plugins.samplers import records as rec
from keras_mgpu_plugins.samplers.gpu import nvml_targets
from keras_mgpu_plugins.samplers.reader import Reader
from keras_mgpu_plugins.samplers.report import summary_table
from keras_mgpu_plugins.samplers.sinks import CSVSink, RecordSinks

NAN = math.nan


# --- step times --------------------------------------------------------------------


def test_step_stats_match_numpy_on_scripted_step_times():
    rng = np.random.default_rng(3)
    seconds = rng.gamma(4.0, 0.005, size=101)
    mean_ms, p50_ms, p95_ms, per_sec = rec.step_stats(seconds)
    assert mean_ms == pytest.approx(1000 * np.mean(seconds), rel=1e-12)
    assert p50_ms == pytest.approx(1000 * np.percentile(seconds, 50), rel=1e-12)
    assert p95_ms == pytest.approx(1000 * np.percentile(seconds, 95), rel=1e-12)
    assert per_sec == pytest.approx(len(seconds) / seconds.sum(), rel=1e-12)


def test_step_stats_with_steps_per_execution_count_batches():
    seconds, batches = np.array([0.4, 0.2, 0.1]), np.array([4, 4, 2])
    mean_ms, p50_ms, p95_ms, per_sec = rec.step_stats(seconds, batches)
    per_batch = seconds / batches  # 0.1, 0.05, 0.05
    assert mean_ms == pytest.approx(1000 * 0.7 / 10)
    assert p50_ms == pytest.approx(1000 * np.percentile(per_batch, 50))
    assert p95_ms == pytest.approx(1000 * np.percentile(per_batch, 95))
    assert per_sec == pytest.approx(10 / 0.7)


def test_step_stats_of_no_interval_are_nan():
    assert np.isnan(rec.step_stats(np.empty(0))).all()


def scripted_timer(times, capacity=4):
    timer = rec.StepTimer(capacity=capacity, clock=iter(times).__next__)
    return timer


def test_step_timer_windows_share_no_interval_and_lose_none():
    times = [0.0, 1.0, 1.5, 1.7, 2.7, 3.0, 3.1]  # 7 batch starts, capacity grows past 4
    timer = scripted_timer(times)
    timer.start_run(skip_first=1)
    for step in range(3):
        timer.mark(step)
    first, _ = timer.take()  # window ends at batch 2's start; the first interval is dropped
    np.testing.assert_allclose(first, [0.5])
    for step in range(3, 7):
        timer.mark(step)
    second, batches = timer.take()
    np.testing.assert_allclose(second, [0.2, 1.0, 0.3, 0.1])
    np.testing.assert_array_equal(batches, [1, 1, 1, 1])
    assert timer.last_step == 6


def test_step_timer_new_epoch_starts_fresh_and_skips_only_once_per_run():
    timer = scripted_timer([0.0, 2.0, 2.5, 10.0, 10.25, 10.75])
    timer.start_run(skip_first=1)
    for step in range(3):
        timer.mark(step)
    np.testing.assert_allclose(timer.take()[0], [0.5])
    timer.start_epoch()  # the gap between epochs (validation) is not a step
    for step in range(3):
        timer.mark(step)
    np.testing.assert_allclose(timer.take()[0], [0.25, 0.5])


def test_step_timer_counts_batches_of_each_execution():
    timer = scripted_timer([0.0, 1.0, 2.0, 2.5])
    timer.start_run(skip_first=0)
    for step in (0, 4, 8, 10):
        timer.mark(step)
    seconds, batches = timer.take()
    np.testing.assert_array_equal(batches, [4, 4, 2])
    np.testing.assert_allclose(seconds, [1.0, 1.0, 0.5])


# --- readings, windows and worker vectors ---------------------------------------------


def test_reduce_window_uses_last_max_mean_and_skips_nan():
    names = ["GPU:0"]
    host = [{"memory_mb": 10.0, "cpu_pct": 50.0}, {"memory_mb": 12.0, "cpu_pct": 150.0}]
    devices = [
        {"GPU:0": {"memory_mb": 100.0, "peak_memory_mb": 400.0, "utilization_pct": 20.0,
                   "power_w": 100.0, "temperature_c": 70.0}},
        {"GPU:0": {"memory_mb": 300.0, "peak_memory_mb": 350.0, "utilization_pct": NAN,
                   "power_w": 300.0, "temperature_c": 60.0}},
    ]
    window = np.stack([rec.reading_vector(h, d, names) for h, d in zip(host, devices, strict=True)])
    out = rec.reduce_window(window, 1)
    host_out = dict(zip(HOST_FIELDS, out[: len(HOST_FIELDS)], strict=True))
    device_out = dict(zip(DEVICE_FIELDS, out[len(HOST_FIELDS):], strict=True))
    assert host_out["memory_mb"] == 12.0 and host_out["cpu_pct"] == 100.0
    assert np.isnan(host_out["tf_memory_mb"])  # never read: stays missing
    assert device_out == {"memory_mb": 300.0, "peak_memory_mb": 400.0, "utilization_pct": 20.0,
                          "power_w": 200.0, "temperature_c": 70.0}


def test_worker_vectors_round_trip_with_padding():
    run = np.array([10.0, 9.0, 15.0, 100.0, 8.0])
    one = rec.reading_vector({"memory_mb": 1.0}, {"GPU:0": {"memory_mb": 5.0}}, ["GPU:0"])
    two = rec.reading_vector({"memory_mb": 2.0}, {"GPU:0": {"memory_mb": 6.0}, "GPU:1": {"memory_mb": 7.0}},
                             ["GPU:0", "GPU:1"])
    matrix = np.stack([rec.worker_vector(run, one, 2), rec.worker_vector(run + 1, two, 2)])
    names = rec.remote_device_names(["GPU:0", "GPU:1"], [1, 2])
    assert names == [["GPU:0"], ["GPU:0", "GPU:1"]]
    workers = rec.unpack(matrix, names)
    assert workers[0].run["step_time/mean_ms"] == 10.0 and workers[1].run["step_time/mean_ms"] == 11.0
    assert list(workers[0].devices) == ["GPU:0"] and workers[0].devices["GPU:0"]["memory_mb"] == 5.0
    assert workers[1].devices["GPU:1"]["memory_mb"] == 7.0 and workers[1].host["memory_mb"] == 2.0
    assert workers[1].run["rows_per_batch"] == 9.0
    assert np.isnan(workers[1].run["failed_reads"])  # not sent: the reading keeps its place
    full = rec.worker_vector(np.append(run, 2.0), one, 1)
    assert rec.unpack(full[None], [["GPU:0"]])[0].run["failed_reads"] == 2.0


def test_samples_per_second_add_up_the_rows_every_worker_counted():
    workers = [record([1.0], [1.0]), record([1.0], [1.0])]
    workers[0].run["rows_per_batch"], workers[1].run["rows_per_batch"] = 8.0, 8.0
    metrics = rec.flatten(workers, replicas=4)
    assert metrics["throughput/samples_per_sec"] == 16 * 50.0  # the chief's 50 batches/s
    assert metrics["throughput/samples_per_sec_per_replica"] == 16 * 50.0 / 4
    assert rec.flatten(workers, batch_size=32)["throughput/samples_per_sec"] == 32 * 50.0


def record(memory, util, host_mb=800.0, run=(20.0, 19.0, 30.0, 50.0)):
    devices = {f"GPU:{i}": {"memory_mb": m, "peak_memory_mb": m + 1, "utilization_pct": u,
                            "power_w": NAN, "temperature_c": NAN}
               for i, (m, u) in enumerate(zip(memory, util, strict=True))}
    host = {"memory_mb": host_mb, "cpu_pct": 90.0, "tf_memory_mb": NAN, "tf_peak_memory_mb": NAN}
    return rec.WorkerRecord(run=dict(zip(rec.RUN_FIELDS, run, strict=True)), host=host, devices=devices)


def test_flatten_single_worker_keys_are_short():
    metrics = rec.flatten([record([100.0, 300.0], [40.0, 60.0])], batch_size=64, replicas=2)
    assert metrics["device/GPU:1/memory_mb"] == 300.0
    assert metrics["device/GPU:0/peak_memory_mb"] == 101.0
    assert metrics["host/memory_mb"] == 800.0
    assert metrics["device/peak_memory_mb_max"] == 301.0
    assert metrics["device/utilization_pct_mean"] == 50.0
    assert metrics["throughput/samples_per_sec"] == 64 * 50.0
    assert metrics["throughput/samples_per_sec_per_replica"] == 64 * 50.0 / 2
    assert not any("worker" in k for k in metrics)


def test_flatten_several_workers_scopes_devices_and_hosts_and_takes_chief_run():
    workers = [record([100.0], [10.0], 700.0), record([200.0], [30.0], 900.0, run=(1, 1, 1, 1))]
    metrics = rec.flatten(workers)
    assert metrics["device/worker0/GPU:0/memory_mb"] == 100.0
    assert metrics["device/worker1/GPU:0/memory_mb"] == 200.0
    assert metrics["host/worker1/memory_mb"] == 900.0
    assert metrics["step_time/mean_ms"] == 20.0  # the chief's
    assert metrics["device/utilization_pct_mean"] == 20.0
    assert np.isnan(metrics["throughput/samples_per_sec"])  # no batch size, no rows counted
    assert "device/GPU:0/memory_mb" not in metrics


def test_key_schema_is_frozen_at_the_first_record():
    schema = rec.KeySchema()
    first = schema.apply({"a": 1.0, "b": NAN, "c": 3.0})
    assert first == {"a": 1.0, "c": 3.0}
    later = schema.apply({"a": 2.0, "b": 5.0, "d": 1.0})
    assert list(later) == ["a", "c"] and later["a"] == 2.0 and np.isnan(later["c"])
    kept = rec.KeySchema()  # a reading failed at the first record: its keys are not lost
    assert list(kept.apply({"a": 1.0, "b": NAN}, keep_missing=True)) == ["a", "b"]
    assert kept.apply({"a": 2.0, "b": 5.0}) == {"a": 2.0, "b": 5.0}


def test_progbar_keys_are_the_aggregates():
    metrics = rec.flatten([record([1.0] * 8, [50.0] * 8)], batch_size=8)
    shown = [k for k in metrics if k in rec.PROGBAR_KEYS]
    assert sorted(shown) == sorted(rec.PROGBAR_KEYS)
    assert len(metrics) > 40  # 8 devices x 5 fields, host and run keys


def test_resample_interpolates_each_column():
    times = np.array([0.0, 1.0, 2.0])
    values = np.array([[0.0, NAN], [10.0, NAN], [20.0, NAN]])
    out = rec.resample(times, values, np.array([0.5, 1.5]))
    np.testing.assert_allclose(out[:, 0], [5.0, 15.0])
    assert np.isnan(out[:, 1]).all()
    padded = rec.resample(times, values, np.array([0.5, 1.5]), width=4)  # another worker has more
    np.testing.assert_array_equal(padded[:, :2], out)
    assert padded.shape == (2, 4) and np.isnan(padded[:, 2:]).all()
    nothing = rec.resample(np.empty(0), np.empty((0, 0)), np.array([0.5, 1.5]), width=3)
    assert nothing.shape == (2, 3) and np.isnan(nothing).all()


# --- samplers ------------------------------------------------------------------------


def test_scripted_sampler_peak_restarts_from_current_memory_at_reset():
    sampler = ScriptedSampler([{"GPU:0": {"memory_mb": m}} for m in (100.0, 300.0, 120.0, 110.0)])
    assert isinstance(sampler, DeviceSampler)
    peaks = [sampler.sample()["GPU:0"]["peak_memory_mb"] for _ in range(3)]
    assert peaks == [100.0, 300.0, 300.0]
    sampler.reset_peaks()  # current memory is 120
    assert sampler.sample()["GPU:0"] == {"memory_mb": 110.0, "peak_memory_mb": 120.0}
    assert sampler.sample()["GPU:0"]["memory_mb"] == 110.0  # the last reading repeats
    assert (sampler.calls, sampler.resets) == (5, 1)


def test_scripted_sampler_validates_readings():
    with pytest.raises(ValueError, match="Received: readings=\\[\\]"):
        ScriptedSampler([])
    with pytest.raises(ValueError, match="same devices"):
        ScriptedSampler([{"GPU:0": {}}, {"GPU:1": {}}])


def test_gpu_sampler_on_a_machine_without_gpu_reads_nothing_and_does_not_fail():
    sampler = GPUSampler()
    assert isinstance(sampler, DeviceSampler)
    assert sampler.devices() == [] and sampler.sample() == {}
    sampler.reset_peaks()
    sampler.close()


def test_host_sampler_reads_this_process():
    import psutil

    reading = HostSampler().sample()
    rss = psutil.Process().memory_info().rss / 2**20
    assert reading["memory_mb"] == pytest.approx(rss, rel=0.2)
    assert reading["cpu_pct"] >= 0.0


@pytest.mark.parametrize(
    "visible, expected",
    [
        (None, [0, 1]),
        ("", [0, 1]),
        ("3,1", [3, 1]),
        ("GPU-aaaa, GPU-bbbb", ["GPU-aaaa", "GPU-bbbb"]),
    ],
)
def test_nvml_targets_follow_cuda_visible_devices(visible, expected):
    assert nvml_targets([0, 1], visible) == expected


class Broken:
    """A sampler whose `sample()` raises (or returns `bad`) while `broken`, and whose reset raises."""

    def __init__(self, bad=None):
        self.broken, self.bad = True, bad

    def devices(self):
        return ["GPU:0"]

    def sample(self):
        if not self.broken:
            return {"GPU:0": {"memory_mb": 5.0, "utilization_pct": 50.0}}
        if self.bad is not None:
            return self.bad
        raise RuntimeError("GPU is lost")

    def reset_peaks(self):
        if self.broken:
            raise RuntimeError("cannot reset")


class FixedHost:
    def sample(self):
        return {"memory_mb": 800.0, "cpu_pct": 25.0}

    def reset_peaks(self):
        pass


def test_reader_turns_a_failing_sampler_into_nan_fields_with_one_warning(caplog):
    device = Broken()
    reader = Reader(device, FixedHost())
    width = len(HOST_FIELDS) + len(DEVICE_FIELDS)
    with caplog.at_level(logging.WARNING, logger="keras_mgpu_plugins"):
        first = reader.read()
        reader.reset_peaks()
        reader.read()
    assert first.shape == (width,) and first[:2].tolist() == [800.0, 25.0]  # the host is kept
    assert np.isnan(first[len(HOST_FIELDS):]).all()
    assert reader.take_failures() == 3 and reader.take_failures() == 0
    assert [r.getMessage() for r in caplog.records] == [
        "DeviceMetricsLogger: reading the devices failed (RuntimeError: GPU is lost); its values are "
        "NaN in the records where a reading fails, and training goes on. Later failures in this fit "
        "are not logged."]
    device.broken = False  # it recovers
    recovered = reader.read()
    assert recovered[len(HOST_FIELDS):][[0, 2]].tolist() == [5.0, 50.0] and reader.take_failures() == 0


@pytest.mark.parametrize("bad", [["not", "a", "mapping"], {"GPU:0": {"memory_mb": "lots"}}])
def test_reader_counts_a_reading_that_is_not_one_as_a_failure(bad):
    reader = Reader(Broken(bad), FixedHost())
    assert np.isnan(reader.read()[len(HOST_FIELDS):]).all() and reader.take_failures() == 1


def test_reader_says_what_cannot_be_reported():
    class NoNvml(Broken):
        nvml_error = "nvidia-ml-py is not installed"

    assert Reader(Broken(), FixedHost()).unavailable() is None
    assert Reader(NoNvml(), FixedHost()).unavailable() == (
        "DeviceMetricsLogger: GPU utilisation, power and temperature unavailable: "
        "nvidia-ml-py is not installed.")
    assert Reader(ScriptedSampler([{}]), FixedHost()).unavailable() == (
        "DeviceMetricsLogger: no GPU found; GPU metrics unavailable, reporting host metrics only.")


# --- sampler thread ------------------------------------------------------------------


def test_sampler_thread_reads_at_its_interval_off_the_calling_thread():
    threads = []
    counter = itertools.count()

    def read():
        threads.append(threading.current_thread().name)
        return np.array([float(next(counter))])

    sampler = SamplerThread(read, interval=0.01)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    window = sampler.drain()
    assert window.shape[1] == 1 and 5 <= len(window) <= 40
    np.testing.assert_array_equal(window[:, 0], np.arange(len(window)))
    assert set(threads) == {"kmp-device-sampler"}
    assert sampler.drain().size == 0  # drained


def test_sampler_thread_series_stays_bounded():
    sampler = SamplerThread(lambda: np.array([1.0]), interval=None, max_points=8)
    for _ in range(100):
        sampler.sample_now()
    times, values = sampler.series()
    assert 4 <= len(times) <= 8 and values.shape == (len(times), 1)
    assert np.all(np.diff(times) > 0)


def test_sampler_thread_new_window_drops_readings_taken_before_it_even_in_flight():
    started, release = threading.Event(), threading.Event()
    values = iter([1.0, 2.0, 3.0, 4.0])
    calls = []

    def read():
        value = next(values)
        if value == 2.0:  # this one is in flight while the window restarts
            started.set()
            release.wait(5)
        return np.array([value])

    sampler = SamplerThread(read, interval=None)
    sampler.sample_now()  # 1.0: before the new window, in the window until then
    in_flight = threading.Thread(target=sampler.sample_now)
    in_flight.start()
    assert started.wait(5)
    sampler.new_window(reset=lambda: calls.append("reset"))
    release.set()
    in_flight.join(5)
    assert calls == ["reset"] and sampler.drain().size == 0  # 1.0 and 2.0 are gone
    sampler.sample_now()  # 3.0: after the new window
    np.testing.assert_array_equal(sampler.drain(), [[3.0]])
    np.testing.assert_array_equal(sampler.series()[1][:, 0], [1.0, 2.0, 3.0])  # the run keeps all


def test_sampler_thread_new_window_resets_before_it_opens():
    order = []
    sampler = SamplerThread(lambda: order.append("read") or np.array([0.0]), interval=None)

    def reset():
        order.append("reset")
        sampler.sample_now()  # a reading taken while the reset runs is still stale

    sampler.new_window(reset)
    assert order == ["reset", "read"] and sampler.drain().size == 0


def test_sampler_thread_stops_on_a_failing_read_with_one_warning(caplog):
    def read():
        raise RuntimeError("driver gone")

    sampler = SamplerThread(read, interval=0.01)
    with caplog.at_level(logging.WARNING, logger="keras_mgpu_plugins"):
        sampler.start()
        time.sleep(0.2)
        sampler.stop()
    assert [r.getMessage() for r in caplog.records] == ["Device sampling stopped: RuntimeError: driver gone"]


# --- outputs -------------------------------------------------------------------------


def test_summary_table_shows_each_device_over_the_run():
    epochs = [[record([100.0, 300.0], [40.0, 60.0])], [record([150.0, 250.0], [20.0, 80.0])]]
    table = summary_table(epochs, np.array([12.0, 11.5, 20.25, 80.0]), 16, batch_size=32, replicas=2)
    lines = table.splitlines()
    assert lines[0] == (
        "Device metrics over 2 epoch(s), 16 timed step(s): step time mean 12.0 ms, p50 11.5 ms, "
        "p95 20.2 ms; 2560.0 samples/s (1280.0 per replica)"
    )
    # memory: last; peak: highest; utilisation: mean; no power or temperature (no NVML
    # figure for any device), no column
    assert lines[1].split() == ["worker", "device", "memory", "MB", "peak", "MB", "util", "%"]
    assert lines[2].split() == ["0", "GPU:0", "150.0", "151.0", "30.0"]
    assert lines[3].split() == ["0", "GPU:1", "250.0", "301.0", "70.0"]
    assert lines[5].split()[:3] == ["0", "host", "800.0"]


@pytest.mark.parametrize("tf_host", [None, 12.0])
def test_the_host_table_has_the_tf_column_only_where_tensorflow_reports_it(tf_host):
    """On JAX and torch no TensorFlow host allocator is read: no "TF host MB" column (it
    showed "-" there before)."""
    host = {"memory_mb": 5.0, "cpu_pct": 50.0}
    if tf_host is not None:
        host["tf_peak_memory_mb"] = tf_host
    table = summary_table([[rec.WorkerRecord(run={}, host=host, devices={})]], np.full(4, NAN), 0)
    header, row = table.splitlines()[-2:]
    assert ("TF host MB" in header) == (tf_host is not None)
    assert row.split() == ["0", "host", "5.0", "5.0", "50.0", *(["12.0"] if tf_host else [])]


def test_summary_table_without_gpu_says_so():
    epochs = [[rec.WorkerRecord(run={}, host={"memory_mb": 5.0}, devices={})]]
    table = summary_table(epochs, np.full(4, NAN), 0)
    assert "GPU metrics unavailable (no GPU): host metrics only." in table


def test_csv_sink_header_is_fixed_by_the_first_row(tmp_path):
    sink = CSVSink(str(tmp_path / "sub" / "metrics.csv"))
    sink.write(1.5, 0, 2, "batch", {"a": 1.0, "b": NAN})
    sink.write(3.0, 0, 4, "epoch", {"a": 2.0, "b": 0.5, "c": 9.0})
    sink.close()
    with open(tmp_path / "sub" / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [
        ["time_s", "epoch", "batch", "kind", "a", "b"],
        ["1.500", "0", "2", "batch", "1.0", ""],
        ["3.000", "0", "4", "epoch", "2.0", "0.5"],
    ]


def test_record_sinks_write_each_record_to_the_files_asked_for(tmp_path):
    RecordSinks().write(0.0, 0, 1, "batch", 1, {"a": 1.0})  # none: nothing happens
    RecordSinks().close()
    sinks = RecordSinks(csv_path=str(tmp_path / "m.csv"))
    assert sinks.tensorboard is None
    sinks.write(0.25, 1, 3, "epoch", 7, {"a": 1.0})
    sinks.close()
    assert (tmp_path / "m.csv").read_text().splitlines() == ["time_s,epoch,batch,kind,a", "0.250,1,3,epoch,1.0"]


# --- argument errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "Received: batch_size=0"),
        ({"log_freq": -2}, "Received: log_freq=-2"),
        ({"log_freq": True}, "Received: log_freq=True"),
        ({"log_freq": "batch"}, 'log_freq must be "epoch" or a positive integer'),
        ({"log_freq": 2, "log_every_n_batches": 2}, "pass log_freq only"),
        ({"sample_interval": 0}, "Received: sample_interval=0"),
        ({"progbar": "some"}, "Received: progbar='some'"),
    ],
)
def test_arguments_are_checked_at_construction(kwargs, message):
    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger

    with pytest.raises(ValueError, match=message):
        DeviceMetricsLogger(**kwargs)


def test_log_every_n_batches_is_the_deprecated_name_of_log_freq():
    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger

    assert DeviceMetricsLogger().log_freq == "epoch"
    with pytest.warns(DeprecationWarning, match=r"log_every_n_batches=...\) is deprecated.*log_freq"):
        assert DeviceMetricsLogger(log_every_n_batches=3).log_freq == 3
    with pytest.warns(DeprecationWarning):
        assert DeviceMetricsLogger(log_every_n_batches=None).log_freq == "epoch"


def test_sampler_must_implement_the_interface():
    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger

    with pytest.raises(TypeError, match="devices\\(\\), sample\\(\\) and reset_peaks\\(\\)"):
        DeviceMetricsLogger(sampler=object())
