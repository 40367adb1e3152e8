"""DeviceMetricsLogger's efficiency logic with numbers: peaks, MFU, cost, step phases,
stragglers, the W&B resume record (no training, no backend: every lane runs it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from keras_mgpu_plugins import _step_phases
from keras_mgpu_plugins._flop_count import FlopCount, per_sample, tokens_per_sample
from keras_mgpu_plugins.samplers import efficiency as eff
from keras_mgpu_plugins.samplers import peaks
from keras_mgpu_plugins.samplers import records as rec
from keras_mgpu_plugins.samplers import stragglers as strag

NAN = math.nan

# --- peaks ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, precision, expected", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
    ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA H100 NVL", "tf32", 417.5),
    ("NVIDIA H200", "bf16", 989.5),
    ("NVIDIA H200 NVL", "fp8", 1670.5),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
    ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
    ("NVIDIA B200", "bf16", 2250.0),
    ("NVIDIA GH200 480GB", "fp8", 1979.0),
    ("NVIDIA L4", "bf16", 121.0),
    ("NVIDIA L40S", "fp16", 362.05),
    ("NVIDIA L40", "tf32", 90.5),
    ("Tesla V100-SXM2-16GB", "fp16", 125.0),
    ("Tesla T4", "fp32", 8.1),
    ("TPU v4", "bf16", 275.0),
    ("TPU v5 lite", "bf16", 197.0),
    ("TPU v5p", "bf16", 459.0),
    ("TPU v6 lite", "bf16", 918.0),
])
def test_the_table_gives_each_device_its_dense_datasheet_peak(name, precision, expected):
    value, source = peaks.lookup(name, precision)
    assert value == expected
    assert "dense peak (http" in source


def test_a_device_or_precision_the_table_lacks_has_no_peak_and_says_why():
    assert peaks.lookup("NVIDIA GeForce RTX 4090", "bf16") == (
        None, "no peak known for 'NVIDIA GeForce RTX 4090' in kmp's table")
    value, reason = peaks.lookup("Tesla V100-SXM2-16GB", "bf16")
    assert value is None and "has no bf16 peak" in reason


@pytest.mark.parametrize("dtype, tf32, expected", [
    ("float32", False, "fp32"), ("float32", True, "tf32"), ("bfloat16", True, "bf16"),
    ("float16", False, "fp16"), ("float8_e4m3fn", False, "fp8")])
def test_the_precision_follows_the_compute_dtype(dtype, tf32, expected):
    assert peaks.precision(dtype, tf32) == expected


def test_the_cpu_peak_is_measured_once_per_process():
    first = peaks.cpu_peak_tflops()
    assert 0 < first < 100 and peaks.cpu_peak_tflops() == first


# --- arguments --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1.5, float("nan"), float("inf"), "3", True])
def test_a_peak_or_price_that_is_not_a_positive_number_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"peak_tflops must be a positive number.*peak_tflops="):
        eff.check_positive("peak_tflops", value)
    with pytest.raises(ValueError, match="cost_per_device_hour="):
        eff.check_prices(value, None)


def test_both_prices_are_refused():
    with pytest.raises(ValueError, match="not both"):
        eff.check_prices(2.0, 16.0)
    assert eff.check_prices(None, 16) == (None, 16.0)


# --- the keys of a record ---------------------------------------------------------------


def run(**fields):
    base = dict.fromkeys(rec.WIRE_RUN_FIELDS, NAN)
    base.update({"step_time/mean_ms": 100.0, "step_time/p50_ms": 100.0,
                 "throughput/steps_per_sec": 10.0, "devices": 2.0, "peak_tflops": 20.0})
    base.update(fields)
    return base


def test_flops_mfu_and_tokens_from_the_count_and_the_rows():
    runs = [run(flops_per_sample=1e9, tokens_per_sample=128.0, rows_per_batch=32.0),
            run(flops_per_sample=1e9, tokens_per_sample=128.0, rows_per_batch=32.0)]
    keys = eff.keys(runs, None, None, (1.0, 1.0))
    assert keys["flops/per_step"] == 64e9  # 64 rows a step
    assert keys["throughput/tflops"] == pytest.approx(0.64)  # 10 steps a second
    assert keys["throughput/tflops_per_device"] == pytest.approx(0.16)  # 4 devices
    assert keys["efficiency/mfu_pct"] == pytest.approx(100 * 0.64 / 40)
    assert keys["throughput/tokens_per_sec"] == pytest.approx(64 * 128 * 10)
    assert eff.keys(runs, 16, None, (1, 1))["flops/per_step"] == 16e9  # batch_size= wins


def test_rows_come_from_the_observed_batch_where_none_were_counted():
    runs = [run(flops_per_sample=2.0, observed_rows=8.0)]
    assert eff.keys(runs, None, None, (1, 1))["flops/per_step"] == 16.0


def test_an_unknown_peak_gives_no_mfu():
    keys = eff.keys([run(flops_per_sample=1.0, rows_per_batch=1.0, peak_tflops=NAN)], None,
                    None, (1, 1))
    assert math.isnan(keys["efficiency/mfu_pct"]) and keys["flops/per_step"] == 1.0


def test_cost_per_step_epoch_and_run():
    keys = eff.keys([run()], None, 36.0, (360.0, 720.0))
    assert keys["cost/per_step"] == pytest.approx(36.0 * 0.1 / 3600)
    assert keys["cost/epoch"] == pytest.approx(3.6) and keys["cost/run"] == pytest.approx(7.2)
    assert not any(k.startswith("cost/") for k in eff.keys([run()], None, None, (1, 1)))


def test_the_summary_prints_the_cost_and_what_mfu_would_have_made_it():
    runs = [run(flops_per_sample=1e9, rows_per_batch=40.0)]  # 0.4 TFLOP/s of 20: MFU 2%
    lines = eff.summary(runs, None, 3600.0, 10.0, ["MFU not available: nothing"])
    text = "\n".join(lines)
    assert "MFU 2.00%" in text and "(MFU not available: nothing)" in text
    assert "Cost: 10 for the run" in text
    assert "0.4 at 50% MFU, 0.2 at 100% (the devices' peak)" in text


def test_phase_keys_are_labelled_by_worker_and_hold_the_input_read_ahead():
    runs = [run(phase_input_ms=1.0, phase_host_ms=2.0, phase_compute_ms=3.0,
                phase_input_other_ms=0.5), run(phase_input_ms=0.0)]
    keys = eff.keys(runs, None, None, (1, 1))
    assert keys["phase/worker0/input_ms"] == 1.5 and keys["phase/worker0/host_ms"] == 2.0
    assert "phase/worker1/compute_ms" in keys and keys["straggler/worker"] == -1.0
    assert "phase/input_ms" in eff.keys(runs[:1], None, None, (1, 1))


# --- step phases ------------------------------------------------------------------------


def test_phases_split_each_interval_into_input_host_and_compute():
    # interval 1: 10 ms; 6 in the step (1 of it reading input), 2 reading input between steps
    # interval 2: 8 ms; 4 in the step, 3 waiting in a collective between steps (compute)
    deltas = np.array([[0.006, 0.001, 0.002, 0.0, 0.0], [0.004, 0.0, 0.0, 0.003, 0.003]])
    split = _step_phases.phases(deltas, np.array([0.010, 0.008]))
    np.testing.assert_allclose(split, [[0.003, 0.002, 0.005, 0.0], [0.0, 0.001, 0.007, 0.003]])


def test_the_clock_puts_input_where_it_was_read():
    clock = _step_phases.PhaseClock()
    clock.watch()
    clock.add_input(1.0)  # between steps, on the training thread
    clock.step_began()
    clock.add_input(2.0)  # inside the step
    clock.step_ended()
    import threading

    reader = threading.Thread(target=clock.add_input, args=(4.0,))
    reader.start()
    reader.join()
    with clock.in_collective():  # between steps, on the training thread
        pass
    assert list(clock.totals[1:4]) == [2.0, 1.0, 4.0] and clock.totals[0] > 0
    assert clock.totals[4] > 0


def test_the_step_timer_gives_each_interval_its_counters():
    counters = np.zeros(2)
    timer = rec.StepTimer(capacity=2, clock=iter([0.0, 1.0, 3.0, 6.0]).__next__, counters=counters)
    timer.start_run(skip_first=1)
    for step in range(4):
        counters += step
        timer.mark(step)
    seconds, batches, deltas = timer.take(counters=True)
    np.testing.assert_allclose(seconds, [2.0, 3.0])
    np.testing.assert_allclose(deltas, [[2.0, 2.0], [3.0, 3.0]])


# --- stragglers -------------------------------------------------------------------------


def phases(*rows):
    return np.array(rows, dtype=np.float64)


def test_a_worker_waiting_for_its_input_is_named_with_input():
    # worker 0 waits for worker 1 inside the step (its compute holds the wait)
    found = strag.find(phases([0.1, 0.1, 38.0, 0.0], [30.2, 0.1, 8.0, 0.0]), [38.5, 38.4])
    assert [(s.worker, s.phase) for s in found] == [(1, "input")]
    assert found[0].excess_ms == pytest.approx(30.1)
    assert "worker 1 (input: 30.2 ms a step against 0.1 ms" in found[0].describe()


def test_a_worker_slow_in_host_code_is_named_with_host():
    found = strag.find(phases([0.0, 0.1, 40.0, 0.0], [0.0, 30.2, 10.0, 0.0]), [40.1, 40.2])
    assert [(s.worker, s.phase) for s in found] == [(1, "host")]


def test_input_read_ahead_counts_only_when_it_takes_most_of_the_step():
    bound = strag.find(phases([0.0, 0.1, 30.0, 0.2], [0.0, 0.1, 30.0, 29.0]), [31.0, 31.0])
    assert [(s.worker, s.phase) for s in bound] == [(1, "input")]
    hidden = strag.find(phases([0.0, 0.1, 100.0, 10.0], [0.0, 0.1, 100.0, 40.0]), [100.0, 100.0])
    assert hidden == []


def test_no_worker_is_named_under_the_margin_nor_with_one_worker():
    assert strag.find(phases([0.0, 0.5, 9.0, 0.0], [0.0, 1.9, 8.0, 0.0]), [10.0, 10.0]) == []
    assert strag.find(phases([0.0, 30.0, 1.0, 0.0]), [31.0]) == []
    text = strag.verdict([], phases([0.0, 0.5, 9.0, 0.0], [0.0, 1.9, 8.0, 0.0]), [10.0, 10.0])
    assert text.startswith("no worker holds the others back (input + host differ by 1.4 ms")


def test_compute_is_never_named_every_step_lasting_until_the_same_collective():
    # worker 0's longer compute is its wait for worker 1 inside the step, or worker 1's
    # slowness: timing cannot tell, so nobody is named
    assert strag.find(phases([0.0, 0.1, 50.0, 0.0], [0.0, 0.1, 10.0, 0.0]), [50.0, 50.0]) == []
    assert strag.find(phases([0.0, 0.1, 10.0, 0.0], [0.0, 0.1, 50.0, 0.0]), [10.2, 50.2]) == []


# --- FLOP counts ------------------------------------------------------------------------


def test_tokens_per_sample_are_the_longest_integer_sequence():
    assert tokens_per_sample([((8, 128), "int32"), ((8, 128, 3), "float32")]) == 128.0
    assert tokens_per_sample([((8, 64), "torch.int64"), ((8, 256), "int32")]) == 256.0
    assert math.isnan(tokens_per_sample([((8, 64), "float32")]))


def test_a_count_is_per_row_and_a_zero_count_is_not_one():
    assert per_sample(640.0, 32, "m") == FlopCount(20.0, NAN, 32.0, "m")._replace(
        tokens_per_sample=per_sample(640.0, 32, "m").tokens_per_sample)
    assert "counted no FLOPs" in per_sample(0.0, 32, "m").reason
    assert "batch size" in per_sample(10.0, 0, "m").reason


# --- the W&B resume record --------------------------------------------------------------


class Runtime:
    is_chief, worker_index = True, 0

    def broadcast(self, value):
        return value


def test_the_wandb_run_is_kept_beside_the_backup_and_read_again(tmp_path):
    from keras_mgpu_plugins.callbacks import events
    from keras_mgpu_plugins.integrations import _wandb_resume as resume

    class Model:
        pass

    model = Model()
    assert resume.agreed(model, Runtime(), "chief", {}) is None  # no BackupAndRestore
    events.announce(model, "backup_dir", str(tmp_path / "backup"))
    assert resume.agreed(model, Runtime(), "chief", {"id": "mine"}) is None  # the user's id
    first = resume.agreed(model, Runtime(), "chief", {})
    assert first.run_id.startswith("kmp-") and first.last_step == -1
    first.save(12)
    assert json.loads((tmp_path / "backup" / "wandb_run.json").read_text()) == {
        "id": first.run_id, "step": 12}
    again = resume.agreed(model, Runtime(), "chief", {})
    assert (again.run_id, again.last_step) == (first.run_id, 12)
    group = resume.agreed(model, Runtime(), "group", {})
    assert group.run_id == f"{first.run_id}-w0"
