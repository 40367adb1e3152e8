"""The end of a `DeviceMetricsLogger` run, and the sums its records need.

`gather_series` resamples this worker's background readings on a common time
grid and gathers every worker's (a collective: every worker calls it);
`finish` draws the plot and prints the summary (the chief only); `concat` and
`rows_counted` put together a record's step intervals and rows.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from keras_mgpu_plugins import compat
from keras_mgpu_plugins.samplers import records as rec
from keras_mgpu_plugins.samplers.report import plot_run, summary_table

#: Points of the time grid the plot's series are resampled on.
PLOT_POINTS = 256


def gather_series(thread: Any, t0: float, max_devices: int, runtime: Any) -> np.ndarray:
    """Every worker's readings over the run, `(workers, PLOT_POINTS, 1 + fields)`, time first."""
    times, values = thread.series()
    grid = np.linspace(0.0, max(time.perf_counter() - t0, 1e-9), PLOT_POINTS)
    width = len(rec.HOST_FIELDS) + max_devices * len(rec.DEVICE_FIELDS)
    local = rec.resample(times - t0, values, grid, width)  # the same shape on every worker
    gathered = runtime.all_gather(local)
    return np.concatenate([grid[None, :, None].repeat(len(gathered), 0), gathered], axis=2)


def finish(callback: Any, series: np.ndarray | None) -> None:
    """The chief's plot (of `gather_series`'s `series`) and summary table, as `callback` (the `DeviceMetricsLogger`) asks."""
    if series is not None:
        from keras_mgpu_plugins import _backend

        plot_run(callback.plot, series[0, :, 0], series[:, :, 1:], callback._all_names,
                 callback._epoch_ends, framework=_backend.lane())
    if callback.summary:
        seconds, batches = concat(callback._run_intervals)
        records = callback.records
        rows = sum(w.run["rows_per_batch"] for w in records[-1]) if records else None
        print(summary_table(records, rec.step_stats(seconds, batches), int(batches.sum()),
                            callback.batch_size or rows, callback._replicas))


def rows_counted(model: Any) -> float:
    """Rows this worker's replicas trained on this epoch, as Keras's loss tracker counted them."""
    counts = compat.loss_tracker_rows(model)
    return np.nan if counts is None else float(sum(counts))


def concat(intervals: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """One `(seconds, batches)` pair of arrays from several."""
    if not intervals:
        return np.empty(0), np.empty(0, dtype=np.int64)
    return np.concatenate([s for s, _ in intervals]), np.concatenate([b for _, b in intervals])
