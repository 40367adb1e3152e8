"""The end of a `DeviceMetricsLogger` run, the sums its records need, and what it says once.

`gather_series` resamples this worker's background readings on a common time
grid and gathers every worker's (a collective: every worker calls it);
`finish` draws the plot and prints the summary (the chief only); `concat` and
`rows_counted` put together a record's step intervals and rows; the `warn_*` functions
are the chief's messages (each said once per process, or at each epoch for stragglers).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from keras_mgpu_plugins import compat
from keras_mgpu_plugins.callbacks._device_metrics_run import cost_per_hour
from keras_mgpu_plugins.samplers import efficiency as eff
from keras_mgpu_plugins.samplers import records as rec
from keras_mgpu_plugins.samplers import stragglers as strag
from keras_mgpu_plugins.samplers.report import plot_run, summary_table

logger = logging.getLogger("keras_mgpu_plugins")
_warned: set[str] = set()

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
    records = callback.records
    if series is not None:
        from keras_mgpu_plugins import _backend

        plot_run(callback.plot, series[0, :, 0], series[:, :, 1:], callback._all_names,
                 callback._epoch_ends, framework=_backend.lane(), phases=phases_by_epoch(records))
    if callback.summary:
        seconds, batches = concat(callback._run_intervals)
        rows = sum(w.run["rows_per_batch"] for w in records[-1]) if records else None
        table = summary_table(records, rec.step_stats(seconds, batches), int(batches.sum()),
                              callback.batch_size or rows, callback._replicas)
        runs = eff.over_epochs([[w.run for w in e] for e in records])
        price = (cost_per_hour(callback.cost_per_device_hour, callback.cost_per_worker_hour,
                               records[-1]) if records else None)
        efficiency = callback._efficiency
        lines = eff.summary(runs, callback.batch_size, time.perf_counter() - callback._t0, price,
                            efficiency.reasons() if efficiency is not None else ())
        print("\n".join([table, *lines]))


def phases_by_epoch(records: list) -> np.ndarray | None:
    """`(epochs, workers, 3)` ms per batch in the input, host and compute phases."""
    if not records:
        return None
    values = [[[w.run.get(f"phase_{k}", np.nan) for k in eff.PHASE_KEYS] for w in e]
              for e in records]
    found = np.array(values, dtype=np.float64)
    return found if np.isfinite(found).any() else None


def batches_done(last_step: int | None, batch: int | None, params: Any, model: Any) -> int:
    """Batches done in this epoch: `batch` at a batch start, else all started ones."""
    if batch is not None:
        return batch
    if last_step is None:
        return 0
    steps = (params or {}).get("steps")
    end = last_step + int(getattr(model, "steps_per_execution", 1) or 1)
    return min(end, steps) if steps else end


def close_run(efficiency: Any, thread: Any, sinks: Any, reader: Any, sampler: Any,
              restore_history: Any) -> None:
    """Undoes what a run opened: the step watch, the sampler thread, the files, NVML."""
    if efficiency is not None:
        efficiency.close()
    thread.stop()
    sinks.close()
    close = getattr(reader.device, "close", None)
    if sampler is None and close is not None:
        close()
    if restore_history is not None:
        restore_history()


def warn_once(chief: bool, message: str | None) -> None:
    """The chief logs `message` once per process."""
    if chief and message and message not in _warned:
        _warned.add(message)
        logger.warning(message)


def say_once(chief: bool, efficiency: Any) -> None:
    """What the chief cannot report (FLOPs not counted, no peak), once per process each."""
    for reason in efficiency.reasons() if efficiency is not None else ():
        warn_once(chief, f"DeviceMetricsLogger: {reason}.")


def warn_peers(chief: bool, failed: list[int], warned: set[int]) -> None:
    """The chief names other workers whose readings failed (their own logs hold the error)."""
    new = [i for i in failed if i > 0 and i not in warned]  # 0: logged by its Reader
    if chief and new:
        warned.update(new)
        logger.warning("DeviceMetricsLogger: reading devices or host failed on worker(s) %s; "
                       "their values are NaN where it failed (the error is in that worker's log).",
                       ", ".join(map(str, new)))


def warn_stragglers(epoch: int, workers: list) -> None:
    """The chief names the workers that held the others back in `epoch`, with the figures."""
    runs = [w.run for w in workers]
    found = strag.find(eff.phases_ms(runs), eff.step_ms(runs)) if len(runs) > 1 else []
    if found:
        logger.warning("DeviceMetricsLogger: epoch %d %s", epoch + 1,
                       strag.verdict(found, eff.phases_ms(runs), eff.step_ms(runs)))


def rows_counted(model: Any) -> float:
    """Rows this worker's replicas trained on this epoch, as Keras's loss tracker counted them."""
    counts = compat.loss_tracker_rows(model)
    return np.nan if counts is None else float(sum(counts))


def concat(intervals: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """One `(seconds, batches[, counters])` tuple of arrays from several."""
    if not intervals:
        return np.empty(0), np.empty(0, dtype=np.int64)
    return tuple(np.concatenate([window[i] for window in intervals])
                 for i in range(len(intervals[0])))
