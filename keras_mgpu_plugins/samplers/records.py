"""Pure logic of device metrics: step timing, windows, worker vectors, key names.

No Keras or TensorFlow here: everything takes and returns numbers, and is
unit-tested with numbers.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from keras_mgpu_plugins.samplers.base import (
    DEVICE_FIELDS,
    DEVICE_REDUCTIONS,
    HOST_FIELDS,
    HOST_REDUCTIONS,
)

#: Per-run fields, in the order they travel between workers.
RUN_FIELDS = ("step_time/mean_ms", "step_time/p50_ms", "step_time/p95_ms", "throughput/steps_per_sec")

#: What a worker sends about the run: `RUN_FIELDS`, the rows (samples) its
#: replicas trained on per batch, which add up to the global batch size, and how
#: many of its readings failed in the window (their fields read NaN); then the batches
#: it timed, its ms per batch in each phase (`_step_phases`: the mean, then the median
#: over the window's batches, which the straggler report compares), and what MFU needs: the
#: FLOPs per row it counted, tokens per row, the rows of the batch the count saw, the
#: sum of its devices' peak TFLOP/s and how many devices it has (`samplers.efficiency`).
WIRE_RUN_FIELDS = (*RUN_FIELDS, "rows_per_batch", "failed_reads", "timed_steps",
                   "phase_input_ms", "phase_host_ms", "phase_compute_ms",
                   "phase_input_other_ms", "phase_input_p50_ms", "phase_host_p50_ms",
                   "phase_compute_p50_ms", "phase_input_other_p50_ms", "flops_per_sample",
                   "tokens_per_sample", "observed_rows", "peak_tflops", "devices")

#: The only keys Keras's progress bar shows (with `progbar="summary"`).
PROGBAR_KEYS = frozenset(
    {
        "step_time/mean_ms",
        "throughput/samples_per_sec",
        "device/peak_memory_mb_max",
        "device/utilization_pct_mean",
        "efficiency/mfu_pct",
    }
)

NAN = math.nan


class StepTimer:
    """Batch-start timestamps in a preallocated array: `mark()` is the only per-batch work.

    Args:
        capacity: Initial number of marks (grows by doubling when exceeded).
        clock: Monotonic clock, in seconds.
    """

    def __init__(self, capacity: int = 1024, clock: Callable[[], float] = time.perf_counter,
                 counters: np.ndarray | None = None):
        self.clock = clock
        self.counters = np.zeros(0) if counters is None else counters  # copied at each mark
        self._t = np.empty(max(2, capacity))
        self._s = np.empty(max(2, capacity), dtype=np.int64)
        self._c = np.empty((max(2, capacity), len(self.counters)))
        self._n = 0
        self._start = 0
        self._skip = 0

    def start_run(self, skip_first: int = 1) -> None:
        """Starts a fit: its first `skip_first` intervals (tracing) are not timed."""
        self._skip = skip_first
        self.start_epoch()

    def start_epoch(self) -> None:
        self._n = self._start = 0

    def mark(self, step: int) -> None:
        """Records that batch `step` starts now."""
        n = self._n
        if n == len(self._t):
            self._t = np.concatenate([self._t, np.empty_like(self._t)])
            self._s = np.concatenate([self._s, np.empty_like(self._s)])
            self._c = np.concatenate([self._c, np.empty_like(self._c)])
        self._t[n] = self.clock()
        self._s[n] = step
        self._c[n] = self.counters
        self._n = n + 1

    @property
    def last_step(self) -> int | None:
        return int(self._s[self._n - 1]) if self._n else None

    def take(self, counters: bool = False) -> tuple[np.ndarray, ...]:
        """The intervals between batch starts since the last `take`; starts a new window.

        The latest mark starts the next window, so consecutive windows share no
        interval and lose none. The last batch of an epoch (no later start)
        is not timed: validation and epoch-end callbacks stay out of step times.

        Returns:
            `(seconds, batches)`: each interval's duration and how many batches
            it covered (more than 1 with `steps_per_execution`); with `counters`, also
            how much each of `counters` grew over each interval, `(intervals, len(counters))`.
        """
        t, s = self._t[self._start : self._n], self._s[self._start : self._n]
        c = self._c[self._start : self._n]
        self._start = max(self._n - 1, 0)
        seconds, batches = np.diff(t), np.diff(s)
        drop = min(self._skip, len(seconds))
        self._skip -= drop
        if counters:
            return seconds[drop:], batches[drop:], np.diff(c, axis=0)[drop:]
        return seconds[drop:], batches[drop:]


def step_stats(seconds: np.ndarray, batches: np.ndarray | None = None) -> np.ndarray:
    """Step time mean, p50, p95 (ms per batch) and batches per second.

    Args:
        seconds: Duration of each interval.
        batches: Batches in each interval (default: 1 each).

    Returns:
        A vector in `RUN_FIELDS` order; NaN when there are no intervals.
    """
    seconds = np.asarray(seconds, dtype=np.float64)
    if seconds.size == 0:
        return np.full(len(RUN_FIELDS), NAN)
    batches = np.ones_like(seconds) if batches is None else np.asarray(batches, dtype=np.float64)
    per_batch = seconds / batches
    total_time, total_batches = seconds.sum(), batches.sum()
    return np.array(
        [
            1000.0 * total_time / total_batches,
            1000.0 * np.percentile(per_batch, 50),
            1000.0 * np.percentile(per_batch, 95),
            total_batches / total_time if total_time > 0 else NAN,
        ]
    )


def reading_vector(
    host: Mapping[str, float], devices: Mapping[str, Mapping[str, float]], names: Sequence[str]
) -> np.ndarray:
    """One reading as a flat vector: host fields, then each device's fields."""
    values = [host.get(f, NAN) for f in HOST_FIELDS]
    for name in names:
        fields = devices.get(name, {})
        values += [fields.get(f, NAN) for f in DEVICE_FIELDS]
    return np.array(values, dtype=np.float64)


def reduce_window(window: np.ndarray, num_devices: int) -> np.ndarray:
    """Summarises readings `(readings, fields)` into one reading (NaN-aware)."""
    ops = [HOST_REDUCTIONS[f] for f in HOST_FIELDS]
    ops += [DEVICE_REDUCTIONS[f] for f in DEVICE_FIELDS] * num_devices
    out = np.full(len(ops), NAN)
    if window.size == 0:
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns stay NaN
        for j, op in enumerate(ops):
            column = window[:, j]
            present = column[~np.isnan(column)]
            if present.size:
                out[j] = present[-1] if op == "last" else getattr(np, op)(present)
    return out


def worker_vector(run: np.ndarray, reading: np.ndarray, max_devices: int) -> np.ndarray:
    """What one worker sends: `WIRE_RUN_FIELDS`, host fields, devices padded to `max_devices`."""
    width = len(WIRE_RUN_FIELDS) + len(HOST_FIELDS) + max_devices * len(DEVICE_FIELDS)
    out = np.full(width, NAN)
    out[: len(run)] = run
    start = len(WIRE_RUN_FIELDS)
    out[start : start + len(reading)] = reading
    return out


@dataclasses.dataclass
class WorkerRecord:
    """One worker's summarised readings for a window."""

    run: dict[str, float]
    host: dict[str, float]
    devices: dict[str, dict[str, float]]


def unpack(matrix: np.ndarray, device_names: Sequence[Sequence[str]]) -> list[WorkerRecord]:
    """Splits gathered worker vectors `(workers, width)` back into records."""
    records = []
    nr, nh, nd = len(WIRE_RUN_FIELDS), len(HOST_FIELDS), len(DEVICE_FIELDS)
    for row, names in zip(np.asarray(matrix, dtype=np.float64), device_names, strict=True):
        devices = {}
        for i, name in enumerate(names):
            chunk = row[nr + nh + i * nd : nr + nh + (i + 1) * nd]
            devices[name] = dict(zip(DEVICE_FIELDS, map(float, chunk), strict=True))
        records.append(
            WorkerRecord(
                run=dict(zip(WIRE_RUN_FIELDS, map(float, row[:nr]), strict=True)),
                host=dict(zip(HOST_FIELDS, map(float, row[nr : nr + nh]), strict=True)),
                devices=devices,
            )
        )
    return records


def remote_device_names(local: Sequence[str], counts: Sequence[int]) -> list[list[str]]:
    """Device names of every worker, from this worker's names and everyone's count."""
    return [[local[i] if i < len(local) else f"GPU:{i}" for i in range(n)] for n in counts]


def flatten(
    workers: Sequence[WorkerRecord], batch_size: int | None = None, replicas: int = 1
) -> dict[str, float]:
    """The flat metric keys of one record (NaN where a value is missing).

    Run keys come from the chief (worker 0). Samples per second use
    `batch_size` when given, else the rows every worker counted per batch.
    Per-device and host keys carry `workerK/` only when there are several
    workers.
    """
    run = workers[0].run
    out = {key: run[key] for key in RUN_FIELDS}
    rows = sum(w.run.get("rows_per_batch", NAN) for w in workers)
    samples = (batch_size if batch_size is not None else rows) * run["throughput/steps_per_sec"]
    out["throughput/samples_per_sec"] = samples
    out["throughput/samples_per_sec_per_replica"] = samples / max(1, replicas)
    peaks = [d["peak_memory_mb"] for w in workers for d in w.devices.values()]
    utils = [d["utilization_pct"] for w in workers for d in w.devices.values()]
    out["device/peak_memory_mb_max"] = _nan_reduce(np.max, peaks)
    out["device/utilization_pct_mean"] = _nan_reduce(np.mean, utils)
    multi = len(workers) > 1
    for index, worker in enumerate(workers):
        scope = f"worker{index}/" if multi else ""
        for name, fields in worker.devices.items():
            out.update({f"device/{scope}{name}/{f}": v for f, v in fields.items()})
        out.update({f"host/{scope}{f}": v for f, v in worker.host.items()})
    return out


def _nan_reduce(fn: Callable[[np.ndarray], float], values: Sequence[float]) -> float:
    present = np.asarray([v for v in values if not math.isnan(v)])
    return float(fn(present)) if present.size else NAN


class KeySchema:
    """Freezes the key set at the first record, so CSV headers and logs stay stable.

    Keys whose value is NaN in the first record (a field no device reports)
    are left out for the whole run; a key missing later reads NaN. With
    `keep_missing` (a reading failed), the first record keeps its NaN keys too.
    """

    def __init__(self) -> None:
        self.keys: list[str] | None = None

    def apply(self, metrics: Mapping[str, float], keep_missing: bool = False) -> dict[str, float]:
        if self.keys is None:
            self.keys = [k for k, v in metrics.items() if keep_missing or not math.isnan(v)]
        return {k: float(metrics.get(k, NAN)) for k in self.keys}


def resample(times: np.ndarray, values: np.ndarray, grid: np.ndarray, width: int | None = None) -> np.ndarray:
    """Linear interpolation of each column of `values` at `grid` (NaN-aware).

    With `width`, the result has that many columns: missing ones (no readings,
    fewer devices than another worker) are NaN.
    """
    columns = values.shape[1] if values.ndim == 2 and len(times) else 0
    out = np.full((len(grid), columns if width is None else width), NAN)
    for j in range(min(columns, out.shape[1])):
        present = ~np.isnan(values[:, j])
        if present.any():
            out[:, j] = np.interp(grid, times[present], values[present, j])
    return out
