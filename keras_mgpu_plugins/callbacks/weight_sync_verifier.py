"""WeightSyncVerifier: every replica on every worker holds the same weights."""

from __future__ import annotations

import collections
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from keras_mgpu_plugins import runtime
from keras_mgpu_plugins.callbacks import _freq, events
from keras_mgpu_plugins.callbacks import _weight_sync as _ws
from keras_mgpu_plugins.callbacks._weight_sync import (  # public names, re-exported
    DEFAULT_STATISTICS,
    MAX_LINES,
    MAX_REPORTS,
    ON_MISMATCH,
    RNG_STATES,
    CheckSchedule,
    SyncReport,
    VariableMismatch,
    classify,
    differing_copies,
)
from keras_mgpu_plugins.errors import WeightsOutOfSyncError

__all__ = ["DEFAULT_STATISTICS", "MAX_LINES", "MAX_REPORTS", "ON_MISMATCH", "RNG_STATES",
           "CheckSchedule", "SyncReport", "VariableMismatch", "WeightSyncVerifier", "classify",
           "differing_copies"]

logger = logging.getLogger(__name__)

# The fingerprint graph of each model, kept for later fits and verifiers (tracing costs ~1 s).
_tracked_by_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class WeightSyncVerifier(keras.callbacks.Callback):
    """Checks that every replica on every worker holds identical weights.

    At train begin (catching workers that started from different weights), then
    epoch (`check_freq="epoch"`, the default) or every `check_freq` steps,
    each model and optimizer variable that should be mirrored is fingerprinted
    on each device that holds a copy (an exact bitwise hash: one flipped bit is
    caught; no copy of the weights leaves the device), local replicas are
    compared, and the fingerprints are all-gathered across workers in one
    collective. Only on a mismatch are values exchanged to measure the
    difference. Every worker reaches the same verdict at the same step.

    Sharded variables (JAX's `strategy="model_parallel"` / `"hybrid"`) are
    checked shard by shard: the copies of each shard (the devices that hold
    the same slice: every device for a replicated variable, one device per
    process for a shard under `"hybrid"`) must be identical; different shards
    are not compared. A mismatch names the shard, e.g.
    `hidden/kernel[:, 16:32] [model]: worker 1 device 1`.

    Skipped: per-replica state such as on-read metric accumulators and
    random-generator states. BatchNormalization's moving statistics are
    per replica by Keras's design (each replica updates its own copy from its
    own batch; `get_weights()` and `save()` return replica 0's): they never
    raise, are reported apart (`last_report.unsynced`), and with
    `sync_stats=True` are averaged across replicas and workers at each check,
    at train end, and right before each `kmp.callbacks.ModelCheckpoint` save
    (its `"before_save"` event), so checkpoints hold statistics of all the data
    whatever the order of the callbacks.

    Args:
        check_freq: `"epoch"`: check at the end of every epoch; an int N:
            check every N training steps instead (counted across epochs).
        on_mismatch: `"raise"` a `kmp.WeightsOutOfSyncError` on every worker,
            `"warn"` (log and go on), or `"resync"` (copy the chief's first
            replica to every copy and go on).
        sync_stats: Average the per-replica statistics at each check and
            before each checkpoint save.
        statistics: Names of the non-trainable variables kept per replica.
        check_on_train_begin: Also check before the first step.
        every_n_epochs: Deprecated (one release, `DeprecationWarning`): check
            every n-th epoch; use `check_freq`.
        every_n_batches: Deprecated name of `check_freq=N`.

    Raises:
        ValueError: For a bad `check_freq` (or deprecated interval), both a
            new and a deprecated interval, or an unknown `on_mismatch`.

    Example:
        >>> model.fit(x, y, epochs=10, callbacks=[kmp.callbacks.WeightSyncVerifier(sync_stats=True)])
    """

    #: Why it needs every worker in fit: under parameter servers (only the chief runs fit,
    #: the variables live once) kmp refuses it, naming this.
    needs_every_worker = ("it compares the copies of the weights that every replica and "
                          "worker holds")

    def __init__(self, check_freq: str | int = _freq.UNSET, on_mismatch: str = "raise",
                 sync_stats: bool = False, statistics: Sequence[str] = DEFAULT_STATISTICS,
                 check_on_train_begin: bool = True, *, every_n_epochs: int | None = _freq.UNSET,
                 every_n_batches: int | None = _freq.UNSET) -> None:
        super().__init__()
        self.schedule = CheckSchedule.from_freq(check_freq, every_n_epochs, every_n_batches)
        self.check_freq = self.schedule.every_n_batches or "epoch"
        if on_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_mismatch must be one of {list(ON_MISMATCH)}. "
                             f"Received: on_mismatch={on_mismatch!r}")
        self.on_mismatch, self.sync_stats = on_mismatch, bool(sync_stats)
        self.statistics, self.check_on_train_begin = tuple(statistics), check_on_train_begin
        self.last_report: SyncReport | None = None
        self.reports: collections.deque[SyncReport] = collections.deque(maxlen=MAX_REPORTS)
        self._tracked: Any = None
        self._said: set[str] = set()
        self._epoch = 0
        self._stats_sync = _ws.StatisticsSync()
        # the channel holds the model weakly: it must not keep this callback (and the model) alive
        self._listeners = {"before_save": events.weak_listener(self, "_before_save"),
                           "checkpoint_saved": events.weak_listener(self, "_on_checkpoint_saved")}
        if self.schedule.every_n_batches:  # a batch hook only when asked: Keras may then dispatch async
            self.on_train_batch_end = self._on_train_batch_end

    # --- Keras hooks ------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self._runtime().same_settings(  # they decide when checks (collectives) run, the verdict
            {"check_freq": self.schedule.every_n_batches or (  # or deprecated every_n_epochs=k
                "epoch" if self.schedule.every_n_epochs == 1 else f"every_n_epochs={self.schedule.every_n_epochs}"),
             "on_mismatch": self.on_mismatch,
             "sync_stats": self.sync_stats, "statistics": self.statistics,
             "check_on_train_begin": bool(self.check_on_train_begin)},
            type(self).__name__,
        )
        self.schedule.steps = 0
        self.reports.clear()
        self._stats_sync.reset()
        if self.sync_stats:
            for topic, listener in self._listeners.items():
                events.subscribe(self.model, topic, listener)
        if self.check_on_train_begin:
            self._check("train begin")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch
        self.schedule.start_epoch()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.schedule.after_epoch(epoch):
            self._check(f"end of epoch {epoch + 1}")
            self._stats_sync.done(epoch, None)

    def _on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.schedule.after_batch(batch):
            self._check(f"epoch {self._epoch + 1}, step {self.schedule.steps}")
            self._stats_sync.done(self._epoch, batch)

    def on_train_end(self, logs: dict | None = None) -> None:
        for topic, listener in self._listeners.items():
            events.unsubscribe(self.model, topic, listener)
        if self.sync_stats:
            self._check("train end", stats_only=True)

    # --- events from checkpoint callbacks (subscribed with sync_stats) --------------------
    def _before_save(self, payload: dict) -> None:
        """Averages the statistics into what is about to be saved, once per save point."""
        if payload.get("fit", id(self.params)) != id(self.params):
            return  # left subscribed by a fit that raised; this save belongs to another fit
        epoch, batch = payload["epoch"], payload.get("batch")
        if self._stats_sync.needed_before_save(epoch, batch):  # the same answer on every worker
            self._check(_ws.save_where(epoch, batch), stats_only=True)
            self._stats_sync.done(epoch, batch)

    def _on_checkpoint_saved(self, payload: dict) -> None:
        epoch, batch = payload.get("epoch"), payload.get("batch")
        if (epoch is not None and "order" not in self._said
                and self._stats_sync.saved_before(epoch, batch, self.schedule.after_epoch(epoch))):
            self._said.add("order")
            logger.warning(_ws.saved_before_message(epoch))

    # --- the check ----------------------------------------------------------------------
    def _check(self, where: str, stats_only: bool = False) -> None:
        tracked = self._tracked_variables()
        here = self._runtime()
        if tracked.replicas == 1 and not here.spans_workers:
            self._record(SyncReport(where, (), ()))  # one copy of everything
            return
        local = tracked.fingerprints()
        gathered = here.all_gather(local.reshape(-1)).reshape(-1, *local.shape)
        found = differing_copies(gathered)
        if stats_only:
            found = [(v, c) for v, c in found if tracked.roles[v] == "statistic"]
        if not found:
            self._record(SyncReport(where, (), ()))
            return
        references = {v: _reference(tracked, v, gathered[:, :, v], here) for v, _ in found}
        diffs = self._differences(tracked, found, references, here)
        shards = getattr(tracked, "shards", None) or [""] * len(tracked.paths)
        records = [VariableMismatch(tracked.paths[v], tracked.roles[v], copies,
                                    tuple(float(diffs[w, i, r]) for w, r in copies), shards[v])
                   for i, (v, copies) in enumerate(found)]
        report = SyncReport(where, tuple(m for m in records if m.role != "statistic"),
                            tuple(m for m in records if m.role == "statistic"))
        self._record(report)
        if report.unsynced:
            self._report_unsynced(report)
        if report.mismatches:
            self._act(report, tracked, found, references)
        if self.sync_stats and report.unsynced:
            self._average_statistics(tracked, [v for v, _ in found if tracked.roles[v] == "statistic"],
                                     here, gathered)

    def _differences(self, tracked: Any, found: list, references: dict, here: Any) -> np.ndarray:
        """(workers, found variables, replicas) max |copy - reference|, the same on every worker."""
        local = np.array([[_ws.max_abs_diff(tracked.host_value(copy), references[v])
                           if copy is not None else 0.0 for copy in tracked.copies[v]]
                          for v, _ in found], dtype=np.float64)
        return here.all_gather(local)

    def _act(self, report: SyncReport, tracked: Any, found: list, references: dict) -> None:
        if self.on_mismatch == "raise":
            raise WeightsOutOfSyncError(_ws.mismatch_message(report), list(report.mismatches))
        if self.on_mismatch == "resync":
            for v, _ in found:
                if tracked.roles[v] != "statistic":
                    for copy in _present(tracked.copies[v]):
                        tracked.assign(copy, references[v])
        if self._runtime().is_chief:
            logger.warning(_ws.mismatch_message(report, resynced=self.on_mismatch == "resync"))

    def _report_unsynced(self, report: SyncReport) -> None:
        first = "unsynced" not in self._said
        self._said.add("unsynced")
        if self._runtime().is_chief:
            logger.log(logging.WARNING if first else logging.INFO,
                       _ws.unsynced_message(report, first, self.sync_stats))

    def _average_statistics(self, tracked: Any, indices: list[int], here: Any,
                            fingerprints: np.ndarray) -> None:
        """Every copy of each statistic := its mean over all its copies on all workers (one collective)."""
        sums = [np.sum([tracked.host_value(c).astype(np.float64) for c in _present(tracked.copies[v])]
                       or [_blank(tracked, v).astype(np.float64)], axis=0) for v in indices]
        gathered = here.all_gather(np.concatenate([s.reshape(-1) for s in sums]))
        counts = [int((fingerprints[:, :, v] != _ws.ABSENT).sum()) for v in indices]
        means = _ws.means_of_sums(gathered, counts, [s.shape for s in sums])
        for v, mean in zip(indices, means, strict=True):
            for copy in _present(tracked.copies[v]):
                tracked.assign(copy, mean)

    def _record(self, report: SyncReport) -> None:
        self.last_report = report
        self.reports.append(report)

    # --- what to check, and with whom ---------------------------------------------------
    def _tracked_variables(self) -> Any:
        model = self.model
        variables = list(model.variables)
        optimizer = getattr(model, "optimizer", None)
        optimizer_vars = list(getattr(optimizer, "variables", []) or []) if optimizer else []
        key = (self.statistics, *(id(v) for v in variables + optimizer_vars))
        if self._tracked is None or self._tracked.key != key:
            self._tracked = _tracked_by_model.get(model)
            if self._tracked is None or self._tracked.key != key:
                self._tracked = runtime.of(model).track(variables, optimizer_vars,
                                                        self.statistics, key)
                _tracked_by_model[model] = self._tracked
            # model parallel: one replica of the model, yet small variables copied on each device
            self._say_replicas(max(runtime.of(model).replicas_in_sync, self._tracked.replicas))
        return self._tracked

    def _say_replicas(self, replicas: int) -> None:
        if replicas == 1 and "one replica" not in self._said and self._runtime().is_chief:
            self._said.add("one replica")
            logger.warning(_ws.one_replica_message(self._runtime().num_workers))

    def _runtime(self) -> runtime.Runtime:
        # The model's runtime, or the process's multi-worker one (never created here).
        return runtime.of(self.model).across_workers()


def _present(copies: Sequence[Any]) -> list[Any]:
    """A variable's copies on this worker's devices (`None`: a device holding another shard)."""
    return [copy for copy in copies if copy is not None]


def _blank(tracked: Any, v: int) -> np.ndarray:
    """Zeros shaped and typed as variable `v`'s copies (for a worker that holds none)."""
    shapes, dtypes = getattr(tracked, "shapes", None), getattr(tracked, "dtypes", None)
    if shapes is not None and dtypes is not None:
        return np.zeros(shapes[v], dtypes[v])
    return np.zeros_like(tracked.host_value(tracked.copies[v][0]))


def _reference(tracked: Any, v: int, fingerprints: np.ndarray, here: Any) -> np.ndarray:
    """The value of variable `v`'s first copy (`_weight_sync.first_copy`), on every worker.

    Every worker sends its first local copy (zeros where it holds none, a shard held
    elsewhere); the first holder's is kept (worker 0's replica 0 when every device
    holds a copy). One collective.
    """
    holder, _ = _ws.first_copy(fingerprints)
    mine = _present(tracked.copies[v])
    return here.broadcast(tracked.host_value(mine[0]) if mine else _blank(tracked, v),
                          root=holder)
