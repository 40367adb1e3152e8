"""`DeviceMetricsLogger`: per-device memory, utilisation and throughput of a `fit`.

Keys it adds to the epoch `logs` (stable; `K` is a worker's rank, `DEV` a
device such as `GPU:0`; the `workerK/` part appears only with several workers):

| key                                       | unit   | over the epoch                  |
|-------------------------------------------|--------|---------------------------------|
| `step_time/mean_ms`                       | ms     | mean time per batch (chief)     |
| `step_time/p50_ms`, `step_time/p95_ms`    | ms     | median, 95th percentile (chief) |
| `throughput/steps_per_sec`                | 1/s    | batches per second              |
| `throughput/samples_per_sec`              | 1/s    | samples per second, global      |
| `throughput/samples_per_sec_per_replica`  | 1/s    | the same, per replica           |
| `device/peak_memory_mb_max`               | MB     | highest peak of any device      |
| `device/utilization_pct_mean`             | %      | mean utilisation of all devices |
| `device/[workerK/]DEV/memory_mb`          | MB     | in use at the epoch's end (1)   |
| `device/[workerK/]DEV/peak_memory_mb`     | MB     | peak, reset at each epoch (1)   |
| `device/[workerK/]DEV/utilization_pct`    | %      | mean (NVML)                     |
| `device/[workerK/]DEV/power_w`            | W      | mean (NVML)                     |
| `device/[workerK/]DEV/temperature_c`      | °C     | highest (NVML)                  |
| `host/[workerK/]memory_mb`                | MB     | process RSS at the epoch's end  |
| `host/[workerK/]cpu_pct`                  | %      | process CPU, 100 = one core     |
| `host/[workerK/]tf_memory_mb`             | MB     | TF host allocator, at the end (2) |
| `host/[workerK/]tf_peak_memory_mb`        | MB     | its peak, reset at each epoch (2) |
| `flops/per_step`; `throughput/tflops`, `..._per_device` | FLOP; TFLOP/s | counted once; achieved |
| `throughput/tokens_per_sec`; `efficiency/mfu_pct` | 1/s; % | token inputs; of the peak  |
| `phase/[workerK/]input_ms`, `host_ms`, `compute_ms` | ms | per batch, by phase         |
| `straggler/worker`, `straggler/phase`, `straggler/excess_ms` | | who holds the others back |
| `cost/per_step`, `cost/epoch`, `cost/run` | price  | with `cost_per_*_hour`          |

(1) The lane's own allocator: TensorFlow's `get_memory_info`, JAX's `Device.memory_stats()`,
`torch.cuda`'s statistics (JAX cannot reset a peak: the process's so far). (2) TensorFlow lane
only. docs/efficiency.md explains the FLOPs, MFU, the phases and the straggler report.

A key is present when its value is known at the first record (no `device/`
keys without GPUs, no NVML keys without `nvidia-ml-py`, no `host/tf_*` keys off the
TensorFlow lane), and then for the whole run, so CSV headers stay valid; the summary
table has a column only where some worker has that figure. Keras's progress bar shows only
`step_time/mean_ms`, `throughput/samples_per_sec`, `efficiency/mfu_pct` and the two
`device/` aggregates (see `progbar`).
"""

from __future__ import annotations

import importlib.util
import time
import warnings

import keras
import numpy as np

from keras_mgpu_plugins import _step_phases, compat, runtime
from keras_mgpu_plugins.callbacks import _device_metrics_end as _end
from keras_mgpu_plugins.callbacks import _freq, _resumed_files, events
from keras_mgpu_plugins.callbacks._device_metrics_run import Efficiency, cost_per_hour, run_vector
from keras_mgpu_plugins.samplers import DeviceSampler, GPUSampler, HostSampler, SamplerThread
from keras_mgpu_plugins.samplers import efficiency as eff
from keras_mgpu_plugins.samplers import records as rec
from keras_mgpu_plugins.samplers.reader import Reader
from keras_mgpu_plugins.samplers.sinks import RecordSinks


class DeviceMetricsLogger(keras.callbacks.Callback):
    """Logs per-device memory, utilisation, power and temperature, and throughput.

    At each epoch's end it adds the keys of the module's table to `logs`
    (CSVLogger, TensorBoard and W&B callbacks listed *after* it record them)
    and publishes them on the `"device_metrics"` event topic. Under several
    workers every worker sends a fixed-length vector through
    `Runtime.all_gather` at the same step, so the chief's record covers
    every device of every worker. Only the chief writes files and prints.

    Readings of NVML and the host are taken by a background thread every
    `sample_interval` seconds; the only per-batch work is one clock read into
    a preallocated array, in `on_train_batch_begin` (which leaves Keras's
    asynchronous batch-end dispatch alone). Step times are the intervals
    between consecutive batch starts, so the first interval of each `fit`
    (tracing the train function) and each epoch's last batch (followed by
    validation and epoch-end callbacks, not by a batch) are left out.

    A sampler that raises during `fit` stops neither training nor a worker:
    its fields read NaN where it failed, the first failure is logged, and the
    chief names the workers whose readings failed.

    Args:
        batch_size: Global batch size (what `fit` receives), for samples per
            second. By default the rows Keras's loss tracker counted per batch
            on every worker (the same for full batches; the mean with a
            partial last batch).
        log_freq: `"epoch"` (records at epoch ends only) or an int N: also take
            a record every N batches, written to `log_dir` / `csv_path` and
            published with its batch number. Must be the same on every worker
            (as `plot`), else `SettingsDifferError` on every worker.
        log_every_n_batches: Deprecated name of `log_freq` (N, or `None` for
            `"epoch"`), accepted for one release with a `DeprecationWarning`.
        log_dir: Directory for TensorBoard scalars of every record (chief).
        csv_path: CSV file with one row per record (chief).
        plot: PNG path: memory and utilisation of every device over the run,
            written by the chief at the end of training (needs matplotlib).
        summary: Print a per-device table at the end of training (chief).
        sample_interval: Seconds between background readings, or `None` to
            read only when a record is taken.
        progbar: `"summary"`: Keras's progress bar shows only the aggregate
            keys (every other callback sees all keys); `"all"`: it shows all.
        sampler: Source of device readings (default: `GPUSampler()`, the real
            TensorFlow/NVML one). Any `DeviceSampler`, e.g. a `ScriptedSampler`.
        peak_tflops: Peak TFLOP/s of one device, for MFU (default: kmp's table of
            NVIDIA GPUs and TPUs by precision, or on a CPU a matmul measured once).
        cost_per_device_hour: Price of one device for an hour: adds `cost/` keys and
            the run's cost to the summary.
        cost_per_worker_hour: Price of one worker (process) for an hour, instead.

    Every step is also timed by phase (waiting for input, host code outside the step
    function, inside it) and the model's FLOPs are counted once per compiled step
    function (`compat.watch_steps`); at each epoch's end the chief names a worker that
    holds the others back, and the phase, and logs why MFU or FLOPs are missing, once.

    Raises:
        ValueError: If an argument is out of range (a peak or price that is not a
            positive number included).
        keras_mgpu_plugins.collective.SettingsDifferError: At `fit`, if `plot`
            or `log_freq` differ between workers.
        TypeError: If `sampler` is not a `DeviceSampler`.
        ImportError: If `plot` is given and matplotlib is not installed.

    Example:
        >>> model.fit(x, y, batch_size=256, epochs=20, callbacks=[
        ...     kmp.callbacks.DeviceMetricsLogger(batch_size=256, plot="devices.png"),
        ...     keras.callbacks.CSVLogger("history.csv"),
        ... ])
    """

    def __init__(
        self,
        batch_size: int | None = None,
        log_freq: str | int = _freq.UNSET,
        log_dir: str | None = None,
        csv_path: str | None = None,
        plot: str | None = None,
        summary: bool = True,
        sample_interval: float | None = 1.0,
        progbar: str = "summary",
        sampler: DeviceSampler | None = None,
        log_every_n_batches: int | None = _freq.UNSET,
        peak_tflops: float | None = None,
        cost_per_device_hour: float | None = None,
        cost_per_worker_hour: float | None = None,
    ) -> None:
        super().__init__()
        self.peak_tflops = eff.check_positive("peak_tflops", peak_tflops)
        self.cost_per_device_hour, self.cost_per_worker_hour = eff.check_prices(
            cost_per_device_hour, cost_per_worker_hour)
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None. Received: batch_size={batch_size!r}")
        if log_every_n_batches is None:
            log_every_n_batches = "epoch"
        log_freq = _freq.renamed("DeviceMetricsLogger", "log_every_n_batches", log_every_n_batches,
                                 "log_freq", log_freq, "epoch")
        self._every_n = _freq.batches_between("log_freq", log_freq)
        if sample_interval is not None and not (
            isinstance(sample_interval, (int, float)) and sample_interval > 0
        ):
            raise ValueError(
                "sample_interval must be a positive number of seconds or None. "
                f"Received: sample_interval={sample_interval!r}"
            )
        if progbar not in ("summary", "all"):
            raise ValueError(f'progbar must be "summary" or "all". Received: progbar={progbar!r}')
        if sampler is not None and not isinstance(sampler, DeviceSampler):
            raise TypeError(
                "sampler must implement devices(), sample() and reset_peaks(). "
                f"Received: sampler={sampler!r}"
            )
        if plot is not None and importlib.util.find_spec("matplotlib") is None:
            raise ImportError(
                "DeviceMetricsLogger(plot=...) needs matplotlib: "
                f"pip install 'keras_mgpu_plugins[plot]'. Received: plot={plot!r}"
            )
        self.batch_size = batch_size
        self.log_freq = log_freq
        self.log_dir, self.csv_path, self.plot = log_dir, csv_path, plot
        self.summary = summary
        self.sample_interval = sample_interval
        self.progbar = progbar
        self.sampler = sampler
        self.records: list[list[rec.WorkerRecord]] = []  # one per epoch, every worker
        self._timer = rec.StepTimer(counters=_step_phases.CLOCK.totals)
        self._thread: SamplerThread | None = None
        self._efficiency: Efficiency | None = None

    # --- Keras hooks --------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.batch_size is None and not compat.rows_countable():
            warnings.warn(f"DeviceMetricsLogger does not count the rows trained on "
                          f"{keras.backend.backend()}; pass "
                          "batch_size= (the global batch size given to fit) for samples per "
                          "second.", UserWarning, stacklevel=2)
        self._open_run()
        self._timer.start_run(skip_first=1)
        self._steps_before_epoch = 0
        self._t0 = time.perf_counter()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch, self._last_record, self._epoch_t0 = epoch, 0, time.perf_counter()
        self._intervals: list[tuple[np.ndarray, ...]] = []
        self._readings: list[np.ndarray] = []
        self._timer.start_epoch()
        self._thread.new_window(self._reader.reset_peaks)  # no reading from before it counts

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._timer.mark(batch)
        if self._every and batch - self._last_record >= self._every:
            self._last_record = batch
            self._record("batch", batch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        workers, metrics = self._record("epoch", None)
        self.records.append(workers)
        self._epoch_ends.append(time.perf_counter() - self._t0)
        self._steps_before_epoch += self._batches_done(None)
        if self._chief:
            _end.warn_stragglers(epoch, workers)
        if logs is not None:
            logs.update(metrics)

    def on_train_end(self, logs: dict | None = None) -> None:
        try:
            series = (_end.gather_series(self._thread, self._t0, self._max_devices, self._runtime)
                      if self._plot_gathered else None)
            self._runtime.together(lambda: self._chief and _end.finish(self, series),
                                   "DeviceMetricsLogger: the plot and summary")
        finally:
            self._close_run()

    # --- records ------------------------------------------------------------------

    def _record(self, kind: str, batch: int | None) -> tuple[list, dict]:
        window = self._timer.take(counters=True)
        self._intervals.append(window)
        self._run_intervals.append(window[:2])
        self._thread.sample_now()  # a failing sampler reads NaN (Reader): no worker stops alone
        self._readings.append(self._thread.drain())
        if kind == "epoch":
            window = _end.concat(self._intervals)
            readings = np.concatenate([r for r in self._readings if r.size])
        else:
            readings = self._readings[-1]
        done = self._batches_done(batch)
        rows = _end.rows_counted(self.model) / done if done else np.nan
        stats = np.append(rec.step_stats(*window[:2]), [rows, self._reader.take_failures()])
        run = run_vector(stats, self._efficiency, window)
        vector = rec.worker_vector(run, rec.reduce_window(readings, len(self._names)), self._max_devices)
        workers = rec.unpack(self._runtime.all_gather(vector), self._all_names)
        failed = [i for i, w in enumerate(workers) if w.run["failed_reads"] > 0]
        _end.warn_peers(self._chief, failed, self._peers_warned)
        now = time.perf_counter()
        flat = rec.flatten(workers, self.batch_size, self._replicas)
        flat.update(eff.keys([w.run for w in workers], self.batch_size, cost_per_hour(self.cost_per_device_hour, self.cost_per_worker_hour, workers),
                             (now - self._epoch_t0, now - self._t0)))
        _end.say_once(self._chief, self._efficiency)
        metrics = self._schema.apply(flat, keep_missing=bool(failed))  # a failed first read drops no key
        self._runtime.together(lambda: self._write(kind, batch, metrics),  # chief-only files
                               "DeviceMetricsLogger: writing a record")
        events.publish(self.model, "device_metrics", {"epoch": self._epoch, "batch": batch, "metrics": metrics})
        return workers, metrics

    def _write(self, kind: str, batch: int | None, metrics: dict[str, float]) -> None:
        done = self._batches_done(batch)  # no sinks but on the chief
        self._sinks.write(time.perf_counter() - self._t0, self._epoch, done, kind,
                          self._steps_before_epoch + done, metrics)

    def _batches_done(self, batch: int | None) -> int:
        """Batches done in this epoch: `batch` at a batch start, else all started ones."""
        return _end.batches_done(self._timer.last_step, batch, self.params, self.model)

    # --- run set-up and end -------------------------------------------------------

    def _open_run(self) -> None:
        if self._thread is not None:
            self._thread.stop()  # a previous fit that raised
        if self._efficiency is not None:
            self._efficiency.close()
        self._runtime = runtime.of(self.model)
        self._replicas = self._runtime.replicas_in_sync
        self._chief = self._runtime.is_chief
        # plot and log_freq decide how many collectives run: the same everywhere, or an error.
        self._runtime.same_settings({"plot": self.plot is not None, "log_freq": self.log_freq},
                                    type(self).__name__)
        self._reader = self._runtime.together(  # GPUSampler() made inside: a failure is every worker's
            lambda: Reader(GPUSampler() if self.sampler is None else self.sampler, HostSampler()),
            "DeviceMetricsLogger: opening the samplers")
        self._names, self._peers_warned = self._reader.names, set()
        self._plot_gathered, self._every = self.plot is not None, self._every_n
        counts = self._runtime.all_gather(np.array([len(self._names)]))[:, 0]
        self._max_devices = int(counts.max())
        self._all_names = rec.remote_device_names(self._names, [int(c) for c in counts])
        self._schema = rec.KeySchema()
        self._epoch_ends: list[float] = []
        self._run_intervals: list[tuple[np.ndarray, np.ndarray]] = []
        self.records = []
        self._sinks = RecordSinks()
        self._runtime.together(self._open_sinks, "DeviceMetricsLogger: opening its files")
        self._efficiency = Efficiency(self.model, self.peak_tflops)
        self._thread = SamplerThread(self._reader.read, self.sample_interval)
        self._thread.start()
        _end.warn_once(self._chief, self._reader.unavailable())
        self._restore_history = (compat.hide_from_progbar(self.model, self._hidden_from_progbar)
                                 if self.progbar == "summary" else None)  # the rest see all

    def _open_sinks(self) -> None:
        if self._chief:
            self._sinks = RecordSinks(self.csv_path, self.log_dir, _resumed_files.asker(self))

    def _hidden_from_progbar(self) -> list[str]:
        return [key for key in self._schema.keys or () if key not in rec.PROGBAR_KEYS]

    def _close_run(self) -> None:
        _end.close_run(self._efficiency, self._thread, self._sinks, self._reader, self.sampler,
                       self._restore_history)
