"""WeightSyncVerifier's decisions and messages as pure functions: numpy only, no Keras."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mgpu_plugins.callbacks._freq import UNSET, batches_between, warn_renamed

ON_MISMATCH = ("raise", "warn", "resync")
#: Variables Keras keeps per replica (BatchNormalization's moving statistics), by name.
DEFAULT_STATISTICS = ("moving_mean", "moving_variance", "moving_stddev", "renorm_mean", "renorm_stddev")
#: Random-generator states: legitimately per replica, never checked.
RNG_STATES = ("seed_generator_state",)
#: A fingerprint where a device holds no copy of a variable's piece (JAX sharded layouts).
ABSENT = -1
#: Checks kept in `WeightSyncVerifier.reports`; variables named in one message.
MAX_REPORTS, MAX_LINES = 1000, 20


@dataclasses.dataclass(frozen=True)
class VariableMismatch:
    """One variable (or one shard of it) whose copies differ from its first copy.

    The first copy is the chief's first replica (worker 0, replica 0) for a variable
    every device holds whole; for a shard (`shard` set, JAX's sharded layouts) it is
    the shard's copy on the first worker and device that hold it.

    Attributes:
        path: The variable's path, e.g. `"sequential/dense/kernel"`.
        role: `"model"`, `"optimizer"` or `"statistic"` (per-replica state).
        copies: `(worker, replica)` of each copy that differs; for a shard, `replica`
            is the worker's device (its index among that worker's devices).
        diffs: Max absolute difference of each of those copies from the reference.
        shard: `""` for the whole variable, else the slice compared, e.g. `"[:, 16:32]"`.
    """

    path: str
    role: str
    copies: tuple[tuple[int, int], ...]
    diffs: tuple[float, ...] = ()
    shard: str = ""

    @property
    def max_abs_diff(self) -> float:
        """The largest difference over every copy (NaN if not computed)."""
        return max(self.diffs, default=float("nan"))

    def describe(self) -> str:
        holder = "device" if self.shard else "replica"
        where = [f"worker {w} {holder} {r}" for w, r in self.copies]
        if self.diffs:
            where = [f"{name} (max |diff| {d:.3g})" for name, d in zip(where, self.diffs, strict=True)]
        return f"{self.path}{self.shard} [{self.role}]: " + ", ".join(where)


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """The outcome of one check: `mismatches` (should match, don't) and `unsynced` statistics."""

    where: str
    mismatches: tuple[VariableMismatch, ...]
    unsynced: tuple[VariableMismatch, ...]


def differing_copies(fingerprints: np.ndarray) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
    """Which copies of which variables differ from that variable's first copy.

    Args:
        fingerprints: Shape `(workers, replicas, variables)`; `ABSENT` where a
            device holds no copy (a shard held elsewhere).

    Returns:
        `(variable_index, ((worker, replica), ...))` for each variable with a
        differing copy, in variable order. The first copy is the first present
        one in `(worker, replica)` order: worker 0's replica 0 when every device
        holds one.
    """
    found = [(v, _differing(fingerprints[:, :, v])) for v in range(fingerprints.shape[2])]
    return [(v, copies) for v, copies in found if copies]


def first_copy(fingerprints: np.ndarray) -> tuple[int, int]:
    """`(worker, replica)` of the first present copy in a `(workers, replicas)` column."""
    present = np.argwhere(fingerprints != ABSENT)
    return (int(present[0][0]), int(present[0][1])) if len(present) else (0, 0)


def _differing(column: np.ndarray) -> tuple[tuple[int, int], ...]:
    reference = column[first_copy(column)]
    differ = (column != reference) & (column != ABSENT)
    return tuple((int(w), int(r)) for w, r in zip(*np.nonzero(differ), strict=True))


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

    @classmethod
    def from_arguments(cls, every_n_epochs: int | None, every_n_batches: int | None) -> CheckSchedule:
        """The schedule for these arguments: every epoch if neither is given.

        Raises:
            ValueError: For both intervals, or one that is not a positive integer.
        """
        if every_n_epochs is not None and every_n_batches is not None:
            raise ValueError("Pass every_n_epochs or every_n_batches, not both. Received: "
                             f"every_n_epochs={every_n_epochs}, every_n_batches={every_n_batches}")
        for name, value in (("every_n_epochs", every_n_epochs), ("every_n_batches", every_n_batches)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
        return cls(1 if every_n_batches is None and every_n_epochs is None else every_n_epochs,
                   every_n_batches)

    @classmethod
    def from_freq(cls, check_freq: Any, every_n_epochs: Any = UNSET,
                  every_n_batches: Any = UNSET) -> CheckSchedule:
        """The schedule for `check_freq`, or (deprecated, one release) the older interval arguments."""
        old = {name: value for name, value in (("every_n_epochs", every_n_epochs),
                                               ("every_n_batches", every_n_batches)) if value is not UNSET}
        if not old:
            every = batches_between("check_freq", "epoch" if check_freq is UNSET else check_freq)
            return cls(None if every else 1, every or None)
        if check_freq is not UNSET:
            raise ValueError("WeightSyncVerifier: pass check_freq only (every_n_epochs and every_n_batches "
                             f"are deprecated). Received: check_freq={check_freq!r}, "
                             + ", ".join(f"{n}={v!r}" for n, v in old.items()))
        for name in old:
            warn_renamed("WeightSyncVerifier", name, "check_freq", stacklevel=4)
        return cls.from_arguments(old.get("every_n_epochs"), old.get("every_n_batches"))

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


class StatisticsSync:
    """Where the per-replica statistics were last averaged: once per save point.

    A point is `(epoch, batch)` as Keras numbers them (`batch` is `None` at an
    epoch's end). Every worker updates it at the same hooks, so every worker
    takes the same decision (averaging is a collective).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.point: tuple[int, int | None] | None = None
        self.epoch = -1  # the last epoch whose end was averaged

    def done(self, epoch: int, batch: int | None) -> None:
        self.point = (epoch, batch)
        if batch is None:
            self.epoch = max(self.epoch, epoch)

    def needed_before_save(self, epoch: int, batch: int | None) -> bool:
        """Whether to average before a save at this point (not yet done there)."""
        return self.point != (epoch, batch)

    def saved_before(self, epoch: int, batch: int | None, check_due: bool) -> bool:
        """Whether an epoch-end checkpoint was saved before that epoch's averaging."""
        return batch is None and check_due and epoch > self.epoch


def save_where(epoch: int, batch: int | None) -> str:
    """The `SyncReport.where` of the averaging done before a checkpoint save."""
    return (f"before save, end of epoch {epoch + 1}" if batch is None
            else f"before save, epoch {epoch + 1}, batch {batch + 1}")


def lines(records: Sequence[VariableMismatch]) -> str:
    """The records, one a line, the first `MAX_LINES` of them."""
    shown = [m.describe() for m in records[:MAX_LINES]]
    more = [f"... and {len(records) - MAX_LINES} more"] if len(records) > MAX_LINES else []
    return "\n  ".join(shown + more)


def mismatch_message(report: SyncReport, resynced: bool = False) -> str:
    if any(m.shard for m in report.mismatches):  # a shard's first copy may be on another device
        reference, which = "their first copy", "(for a shard: the first worker, then device, holding it)"
    else:
        reference, which = "the chief's first replica", "(worker 0, replica 0)"
    message = (f"Weights out of sync at {report.where}: {len(report.mismatches)} variable(s) "
               f"differ from {reference} {which}:\n  " + lines(report.mismatches))
    return message + (f"\nResynchronised every copy from {reference}." if resynced else "")


def unsynced_message(report: SyncReport, first: bool, sync_stats: bool) -> str:
    hint = ("" if not first else
            "\nKeras keeps these statistics per replica: each replica updates its own copy from "
            "its own batches, and get_weights()/save() return replica 0's (or normalise over the global batch: @kmp.parallelize(sync_batchnorm=True)). "
            + ("They are averaged across replicas and workers now (sync_stats=True)."
               if sync_stats else "Pass sync_stats=True to average them at each check."))
    return f"Per-replica statistics differ at {report.where}:\n  {lines(report.unsynced)}{hint}"


def one_replica_message(num_workers: int) -> str:
    return ("WeightSyncVerifier: the model has one replica (its strategy spans a single "
            "device, or it was built outside any tf.distribute strategy scope); "
            + ("checking across workers only." if num_workers > 1
               else "with one worker, nothing to compare."))


def saved_before_message(epoch: int) -> str:
    return (f"A checkpoint of epoch {epoch + 1} was saved before WeightSyncVerifier(sync_stats=True) "
            "averaged the per-replica statistics: it holds replica 0's. Its callback does not "
            'publish the "before_save" event (kmp.callbacks.ModelCheckpoint does): list '
            "WeightSyncVerifier before it.")


def means_of_sums(gathered: np.ndarray, replicas: int | Sequence[int],
                  shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Each variable's mean over every copy on every worker.

    Args:
        gathered: Shape `(workers, total size)`: each worker's sums over its
            local copies, the variables flattened one after another.
        replicas: Local replicas per worker (every device holds a copy of each
            variable), or per variable its number of copies over all workers.
        shapes: Each variable's shape, in order.
    """
    sizes = [int(np.prod(shape)) for shape in shapes]
    if isinstance(replicas, (int, np.integer)):
        counts = np.full(len(shapes), gathered.shape[0] * int(replicas))
    else:
        counts = np.asarray(replicas)
    total = gathered.sum(axis=0) / np.repeat(counts, sizes)
    parts = np.split(total, np.cumsum(sizes)[:-1])
    return [part.reshape(shape) for part, shape in zip(parts, shapes, strict=True)]


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.size == 0:
        return 0.0
    if a.dtype == np.bool_:
        a, b = a.astype(np.int8), np.asarray(b).astype(np.int8)
    return float(np.max(np.abs(a.astype(np.float64) - np.asarray(b, dtype=np.float64))))
