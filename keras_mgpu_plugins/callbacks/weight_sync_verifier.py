"""WeightSyncVerifier: every replica on every worker holds the same weights."""

from __future__ import annotations

import collections
import dataclasses
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from keras_mgpu_plugins import collective, fingerprint
from keras_mgpu_plugins.callbacks import events
from keras_mgpu_plugins.errors import WeightsOutOfSyncError

logger = logging.getLogger(__name__)

ON_MISMATCH = ("raise", "warn", "resync")
#: Variables Keras keeps per replica (BatchNormalization's moving statistics), by name.
DEFAULT_STATISTICS = ("moving_mean", "moving_variance", "moving_stddev", "renorm_mean", "renorm_stddev")
#: Random-generator states: legitimately per replica, never checked.
RNG_STATES = ("seed_generator_state",)
#: Checks kept in `WeightSyncVerifier.reports`; variables named in one message.
MAX_REPORTS, MAX_LINES = 1000, 20

# The fingerprint graph of each model, kept for later fits and verifiers (tracing costs ~1 s).
_tracked_by_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class VariableMismatch:
    """One variable whose copies differ from the chief's first replica (worker 0, replica 0).

    Attributes:
        path: The variable's path, e.g. `"sequential/dense/kernel"`.
        role: `"model"`, `"optimizer"` or `"statistic"` (per-replica state).
        copies: `(worker, replica)` of each copy that differs.
        diffs: Max absolute difference of each of those copies from the reference.
    """

    path: str
    role: str
    copies: tuple[tuple[int, int], ...]
    diffs: tuple[float, ...] = ()

    @property
    def max_abs_diff(self) -> float:
        """The largest difference over every copy (NaN if not computed)."""
        return max(self.diffs, default=float("nan"))

    def describe(self) -> str:
        where = [f"worker {w} replica {r}" for w, r in self.copies]
        if self.diffs:
            where = [f"{name} (max |diff| {d:.3g})" for name, d in zip(where, self.diffs, strict=True)]
        return f"{self.path} [{self.role}]: " + ", ".join(where)


def differing_copies(fingerprints: np.ndarray) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
    """Which copies of which variables differ from worker 0's replica 0.

    Args:
        fingerprints: Shape `(workers, replicas, variables)`.

    Returns:
        `(variable_index, ((worker, replica), ...))` for each variable with a
        differing copy, in variable order.
    """
    differ = fingerprints != fingerprints[0, 0]
    return [
        (int(v), tuple((int(w), int(r)) for w, r in zip(*np.nonzero(differ[:, :, v]), strict=True)))
        for v in np.flatnonzero(differ.any(axis=(0, 1)))
    ]


def classify(name: str, trainable: bool, synchronization: str, supported: bool,
             statistics: Sequence[str]) -> str | None:
    """`"synced"` (must match), `"statistic"` (per replica by Keras's design) or None (skip)."""
    if not supported or synchronization == "on_read" or name in RNG_STATES:
        return None
    return "statistic" if not trainable and name in statistics else "synced"


class CheckSchedule:
    """When to check: every `every_n_epochs` epochs, or every `every_n_batches` steps.

    Steps are counted over the whole fit (across epochs) from the `batch`
    index Keras passes, so `steps_per_execution > 1` counts right.
    """

    def __init__(self, every_n_epochs: int | None, every_n_batches: int | None) -> None:
        self.every_n_epochs, self.every_n_batches = every_n_epochs, every_n_batches
        self.steps = 0
        self._seen_in_epoch = 0

    def start_epoch(self) -> None:
        self._seen_in_epoch = 0

    def after_batch(self, batch: int) -> bool:
        if not self.every_n_batches:
            return False
        before = self.steps
        self.steps += batch + 1 - self._seen_in_epoch
        self._seen_in_epoch = batch + 1
        return self.steps // self.every_n_batches > before // self.every_n_batches

    def after_epoch(self, epoch: int) -> bool:
        return bool(self.every_n_epochs) and (epoch + 1) % self.every_n_epochs == 0


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """The outcome of one check: `mismatches` (should match, don't) and `unsynced` statistics."""

    where: str
    mismatches: tuple[VariableMismatch, ...]
    unsynced: tuple[VariableMismatch, ...]


class WeightSyncVerifier(keras.callbacks.Callback):
    """Checks that every replica on every worker holds identical weights.

    At train begin (catching workers that started from different weights), then
    every `every_n_epochs` epochs (default 1) or every `every_n_batches` steps,
    each model and optimizer variable that should be mirrored is fingerprinted
    on each device that holds a copy (an exact bitwise hash: one flipped bit is
    caught; no copy of the weights leaves the device), local replicas are
    compared, and the fingerprints are all-gathered across workers in one
    collective. Only on a mismatch are values exchanged to measure the
    difference. Every worker reaches the same verdict at the same step.

    Skipped: per-replica state such as on-read metric accumulators and
    random-generator states. BatchNormalization's moving statistics are
    per replica by Keras's design (each replica updates its own copy from its
    own batch; `get_weights()` and `save()` return replica 0's): they never
    raise, are reported apart (`last_report.unsynced`), and with
    `sync_stats=True` are averaged across replicas and workers at each check and
    at train end, so checkpoints hold statistics of all the data (list this
    callback before checkpoint callbacks).

    Args:
        every_n_epochs: Check at the end of every n-th epoch (default 1).
        every_n_batches: Check every n training steps instead.
        on_mismatch: `"raise"` a `kmp.WeightsOutOfSyncError` on every worker,
            `"warn"` (log and go on), or `"resync"` (copy the chief's first
            replica to every copy and go on).
        sync_stats: Average the per-replica statistics at each check.
        statistics: Names of the non-trainable variables kept per replica.
        check_on_train_begin: Also check before the first step.

    Raises:
        ValueError: For a non-positive interval, both intervals, or an unknown
            `on_mismatch`.

    Example:
        >>> model.fit(x, y, epochs=10, callbacks=[kmp.callbacks.WeightSyncVerifier(sync_stats=True)])
    """

    def __init__(self, every_n_epochs: int | None = None, every_n_batches: int | None = None,
                 on_mismatch: str = "raise", sync_stats: bool = False,
                 statistics: Sequence[str] = DEFAULT_STATISTICS,
                 check_on_train_begin: bool = True) -> None:
        super().__init__()
        if every_n_epochs is not None and every_n_batches is not None:
            raise ValueError("Pass every_n_epochs or every_n_batches, not both. Received: "
                             f"every_n_epochs={every_n_epochs}, every_n_batches={every_n_batches}")
        for name, value in (("every_n_epochs", every_n_epochs), ("every_n_batches", every_n_batches)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
        if on_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_mismatch must be one of {list(ON_MISMATCH)}. "
                             f"Received: on_mismatch={on_mismatch!r}")
        if every_n_epochs is None and every_n_batches is None:
            every_n_epochs = 1
        self.schedule = CheckSchedule(every_n_epochs, every_n_batches)
        self.on_mismatch, self.sync_stats = on_mismatch, bool(sync_stats)
        self.statistics, self.check_on_train_begin = tuple(statistics), check_on_train_begin
        self.last_report: SyncReport | None = None
        self.reports: collections.deque[SyncReport] = collections.deque(maxlen=MAX_REPORTS)
        self._tracked: Any = None
        self._said: set[str] = set()
        self._epoch, self._synced_epoch = 0, -1
        if every_n_batches is not None:  # a batch hook only when asked: Keras may then dispatch async
            self.on_train_batch_end = self._on_train_batch_end

    # --- Keras hooks ------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self.schedule.steps = 0
        self.reports.clear()
        events.subscribe(self.model, "checkpoint_saved", self._on_checkpoint_saved)
        if self.check_on_train_begin:
            self._check("train begin")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch
        self.schedule.start_epoch()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.schedule.after_epoch(epoch):
            self._check(f"end of epoch {epoch + 1}")
            self._synced_epoch = epoch

    def _on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.schedule.after_batch(batch):
            self._check(f"epoch {self._epoch + 1}, step {self.schedule.steps}")

    def on_train_end(self, logs: dict | None = None) -> None:
        events.unsubscribe(self.model, "checkpoint_saved", self._on_checkpoint_saved)
        if self.sync_stats:
            self._check("train end", stats_only=True)

    # --- the check ----------------------------------------------------------------------
    def _check(self, where: str, stats_only: bool = False) -> None:
        tracked = self._tracked_variables()
        strategy = self._gather_strategy()
        if tracked.replicas == 1 and not collective.spans_workers(strategy):
            self._record(SyncReport(where, (), ()))  # one copy of everything
            return
        local = tracked.fingerprints()
        gathered = collective.all_gather(local.reshape(-1), strategy).reshape(-1, *local.shape)
        found = differing_copies(gathered)
        if stats_only:
            found = [(v, c) for v, c in found if tracked.roles[v] == "statistic"]
        if not found:
            self._record(SyncReport(where, (), ()))
            return
        references = {v: collective.broadcast(_numpy(tracked.copies[v][0]), strategy) for v, _ in found}
        diffs = self._differences(tracked, found, references, strategy)
        records = [VariableMismatch(tracked.paths[v], tracked.roles[v], copies,
                                    tuple(float(diffs[w, i, r]) for w, r in copies))
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
                                     strategy)

    def _differences(self, tracked: Any, found: list, references: dict, strategy: Any) -> np.ndarray:
        """(workers, found variables, replicas) max |copy - reference|, the same on every worker."""
        local = np.array([[_max_abs_diff(_numpy(copy), references[v]) for copy in tracked.copies[v]]
                          for v, _ in found], dtype=np.float64)
        return collective.all_gather(local, strategy)

    def _act(self, report: SyncReport, tracked: Any, found: list, references: dict) -> None:
        message = (f"Weights out of sync at {report.where}: {len(report.mismatches)} variable(s) "
                   f"differ from the chief's first replica (worker 0, replica 0):\n  "
                   + _lines(report.mismatches))
        if self.on_mismatch == "raise":
            raise WeightsOutOfSyncError(message, list(report.mismatches))
        if self.on_mismatch == "resync":
            for v, _ in found:
                if tracked.roles[v] != "statistic":
                    for copy in tracked.copies[v]:
                        _assign(copy, references[v])
            message += "\nResynchronised every copy from the chief's first replica."
        if collective.is_chief():
            logger.warning(message)

    def _report_unsynced(self, report: SyncReport) -> None:
        lines = _lines(report.unsynced)
        first = "unsynced" not in self._said
        self._said.add("unsynced")
        hint = ("" if not first else
                "\nKeras keeps these statistics per replica: each replica updates its own copy from "
                "its own batches, and get_weights()/save() return replica 0's. "
                + ("They are averaged across replicas and workers now (sync_stats=True)."
                   if self.sync_stats else "Pass sync_stats=True to average them at each check."))
        if collective.is_chief():
            logger.log(logging.WARNING if first else logging.INFO,
                       "Per-replica statistics differ at %s:\n  %s%s", report.where, lines, hint)

    def _average_statistics(self, tracked: Any, indices: list[int], strategy: Any) -> None:
        """Every copy of each statistic := its mean over all replicas of all workers (one collective)."""
        sums = [np.sum([_numpy(c).astype(np.float64) for c in tracked.copies[v]], axis=0) for v in indices]
        flat = np.concatenate([s.reshape(-1) for s in sums]) if sums else np.zeros(0)
        gathered = collective.all_gather(flat, strategy)
        total = gathered.sum(axis=0) / (gathered.shape[0] * len(tracked.copies[indices[0]]))
        offset = 0
        for v, s in zip(indices, sums, strict=True):
            mean = total[offset : offset + s.size].reshape(s.shape)
            offset += s.size
            for copy in tracked.copies[v]:
                _assign(copy, mean)

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
                self._tracked = _Tracked(model.distribute_strategy, variables, optimizer_vars,
                                         self.statistics, key)
                _tracked_by_model[model] = self._tracked
            self._say_replicas(model.distribute_strategy.num_replicas_in_sync)
        return self._tracked

    def _say_replicas(self, replicas: int) -> None:
        if replicas == 1 and "one replica" not in self._said and collective.is_chief():
            self._said.add("one replica")
            logger.warning("WeightSyncVerifier: the model has one replica (it was built outside any "
                           "tf.distribute strategy scope); %s.", "checking across workers only"
                           if collective.num_workers() > 1 else "with one worker, nothing to compare")

    def _gather_strategy(self) -> Any:
        strategy = self.model.distribute_strategy
        if collective.num_workers() == 1 or collective.spans_workers(strategy):
            return strategy
        from keras_mgpu_plugins import strategy as strategies  # the process's multi-worker one

        return strategies.get_strategy("multi_worker")

    def _on_checkpoint_saved(self, payload: dict) -> None:
        epoch = payload.get("epoch")
        if (self.sync_stats and payload.get("batch") is None and epoch is not None
                and epoch > self._synced_epoch and self.schedule.after_epoch(epoch)
                and "order" not in self._said):
            self._said.add("order")
            logger.warning("A checkpoint of epoch %d was saved before WeightSyncVerifier(sync_stats=True) "
                           "averaged the per-replica statistics: it holds replica 0's. List "
                           "WeightSyncVerifier before checkpoint callbacks.", epoch + 1)


class _Tracked:
    """The variables to check, their per-replica copies, and their fingerprinter."""

    def __init__(self, strategy: Any, variables: list, optimizer_vars: list,
                 statistics: Sequence[str], key: tuple) -> None:
        import tensorflow as tf

        self.key, self.paths, self.roles, self.copies = key, [], [], []
        seen: set[int] = set()
        for role, group in (("model", variables), ("optimizer", optimizer_vars)):
            for var in group:
                name = var.path.rsplit("/", 1)[-1]
                kind = classify(name, var.trainable, getattr(var, "synchronization", "auto"),
                                fingerprint.supports(tf.as_dtype(var.dtype)), statistics)
                if kind is None or id(var) in seen:
                    continue
                seen.add(id(var))
                self.paths.append(var.path)
                self.roles.append("statistic" if kind == "statistic" else role)
                self.copies.append(_local_copies(strategy, var))
        self.replicas = len(self.copies[0]) if self.copies else 1
        groups = [[copies[r] for copies in self.copies] for r in range(self.replicas)]
        self.fingerprints = fingerprint.make_fingerprinter(groups)


def _local_copies(strategy: Any, variable: Any) -> tuple:
    """This worker's per-replica copies of a Keras variable (its tf.Variable components).

    The one place that reaches through Keras (`variable.value`, the backend
    variable) into `tf.distribute` (`experimental_local_results`): the copies are
    read for fingerprints and written by `"resync"` and `sync_stats`.
    """
    return tuple(strategy.experimental_local_results(variable.value))


def _lines(records: Sequence[VariableMismatch]) -> str:
    shown = [m.describe() for m in records[:MAX_LINES]]
    more = [f"... and {len(records) - MAX_LINES} more"] if len(records) > MAX_LINES else []
    return "\n  ".join(shown + more)


def _numpy(copy: Any) -> np.ndarray:
    return np.asarray(copy.numpy())


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.size == 0:
        return 0.0
    if a.dtype == np.bool_:
        a, b = a.astype(np.int8), np.asarray(b).astype(np.int8)
    return float(np.max(np.abs(a.astype(np.float64) - np.asarray(b, dtype=np.float64))))


def _assign(copy: Any, value: np.ndarray) -> None:
    import tensorflow as tf

    with tf.device(copy.device):
        copy.assign(tf.constant(np.asarray(value).astype(copy.dtype.as_numpy_dtype)))
