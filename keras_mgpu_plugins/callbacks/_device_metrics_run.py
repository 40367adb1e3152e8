"""What `DeviceMetricsLogger` measures beside the device readings: step phases, FLOPs, peaks.

`Efficiency` is opened at each `fit`'s start: it watches the model's train function
(`compat.watch_steps`: every step timed, the first one's FLOPs counted once per train
function), reads what this process's devices are and their peak FLOP/s (`samplers.peaks`),
and adds to each record's vector what the other workers need (`window`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from keras_mgpu_plugins import _backend, _step_phases, compat
from keras_mgpu_plugins._flop_count import FlopCount
from keras_mgpu_plugins.samplers import peaks
from keras_mgpu_plugins.samplers import records as rec

NAN = math.nan


class Efficiency:
    """This worker's step watch, devices and their peak, and why MFU may be missing.

    Args:
        model: The model being trained.
        peak_tflops: The user's peak per device (TFLOP/s), or `None` for the table.
    """

    def __init__(self, model: Any, peak_tflops: float | None) -> None:
        self.watch = compat.watch_steps(model)
        backend = _backend.active()
        try:
            kinds = backend.compute_devices() or ["cpu"]
            self.peak, self.peak_source, self.peak_reason = _peak(model, kinds, peak_tflops,
                                                                  backend)
        except Exception as err:  # noqa: BLE001 - monitoring must not stop training
            kinds = kinds if "kinds" in locals() else ["cpu"]
            self.peak, self.peak_source = NAN, ""
            self.peak_reason = f"the devices' peak could not be read ({type(err).__name__}: {err})"
        self.devices = len(kinds)

    @property
    def count(self) -> FlopCount | None:
        return None if self.watch is None else self.watch.count

    def reasons(self) -> list[str]:
        """What this worker cannot report, in words (FLOPs not counted, no peak)."""
        out = []
        if self.watch is None:
            out.append("FLOPs and step phases not measured: this Keras's train function is "
                       "not the one kmp knows (see the warning about train_function_watched)")
        elif self.count is not None and self.count.reason:
            out.append(f"FLOPs not counted: {self.count.reason}; the rest is logged")
        if self.peak_reason:
            out.append(f"MFU not available: {self.peak_reason}")
        return out

    def window(self, seconds: np.ndarray, batches: np.ndarray, deltas: np.ndarray) -> list[float]:
        """The fields `records.WIRE_RUN_FIELDS` adds after the failed reads, for one window."""
        timed = float(batches.sum()) if batches.size else 0.0
        if self.watch is not None and timed > 0:
            spent = _step_phases.phases(deltas, seconds)
            typical = np.median(spent / np.asarray(batches, dtype=np.float64)[:, None], axis=0)
            per_step = [*(1000.0 * spent.sum(axis=0) / timed), *(1000.0 * typical)]
        else:
            per_step = [NAN] * 8
        count = self.count or FlopCount()
        return [timed, *per_step, count.flops_per_sample, count.tokens_per_sample, count.rows,
                self.peak, float(self.devices)]

    def close(self) -> None:
        if self.watch is not None:
            self.watch.undo()


def _peak(model: Any, kinds: list[str], given: float | None,
          backend: Any) -> tuple[float, str, str | None]:
    """`(sum of this worker's device peaks, where from, why not)`: TFLOP/s, NaN if unknown."""
    if given is not None:
        return given * len(kinds), f"peak_tflops={given:g} per device (given)", None
    dtype = str(getattr(getattr(model, "dtype_policy", None), "compute_dtype", "float32"))
    precision = peaks.precision(dtype, bool(backend.float32_on_tensor_cores()))
    total, sources = 0.0, []
    for kind in kinds:
        if kind == "cpu":  # the CPU devices of a process share its cores
            total += peaks.cpu_peak_tflops() / len(kinds)
            source = "CPU: a float32 matmul measured once by this process (NumPy)"
        else:
            value, source = peaks.lookup(kind, precision)
            if value is None:
                return NAN, "", (f"{source}, for a model computing in {dtype}; pass "
                                 "DeviceMetricsLogger(peak_tflops=...) (TFLOP/s per device)")
            total += value
        if source not in sources:
            sources.append(source)
    return total, "; ".join(sources), None


def run_vector(stats_and_rows: np.ndarray, efficiency: Efficiency | None, window: tuple) -> np.ndarray:
    """One worker's run fields for a record, in `records.WIRE_RUN_FIELDS` order."""
    extra = efficiency.window(*window) if efficiency is not None else []
    out = np.full(len(rec.WIRE_RUN_FIELDS), NAN)
    values = np.append(stats_and_rows, extra)
    out[: len(values)] = values
    return out


def cost_per_hour(per_device: float | None, per_worker: float | None,
                  workers: list) -> float | None:
    """What the whole job costs per hour (`None`: no price given), from the gathered records."""
    if per_worker is not None:
        return per_worker * len(workers)
    if per_device is not None:
        return per_device * sum(w.run["devices"] for w in workers)
    return None
