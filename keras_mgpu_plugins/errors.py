"""Exceptions raised across the package."""

from __future__ import annotations

from typing import Any


class WeightsOutOfSyncError(RuntimeError):
    """Replicas or workers hold different values for a variable that should be in sync.

    Raised on every worker at the same step by
    `kmp.callbacks.WeightSyncVerifier(on_mismatch="raise")`.

    Attributes:
        mismatches: One record per variable that differs: its path, which
            replicas/workers differ, and by how much.
    """

    def __init__(self, message: str, mismatches: list[Any] | None = None) -> None:
        super().__init__(message)
        self.mismatches = list(mismatches or [])


class TopologyError(ValueError):
    """The environment describes a cluster that cannot be used."""


class SeparateModelsError(RuntimeError):
    """Each process of a job of several would train a model of its own (`runtime.apart`).

    Raised on every process, before the first step, by a `fit` that kmp's callbacks (or,
    once kmp joined the job, any callbacks) act for, of a model that does not train as one
    with the job's other processes: not built by `@kmp.parallelize`, nor under the job's
    own distribution.
    """


class StrategyError(RuntimeError):
    """A strategy cannot be created as asked (`kmp.strategy.StrategyError`)."""


class RuntimeAlreadyStartedError(RuntimeError):
    """The backend's runtime started before devices could be configured."""


class ModelTooLargeError(ValueError):
    """A sharded model's parameters and optimizer slots exceed a device's memory.

    Raised by `@kmp.parallelize(strategy="model_parallel")` (or `"hybrid"`) on JAX when
    the factory returns, before the first step, where the platform reports device memory.

    Attributes:
        devices: One record per device that cannot hold its part
            (`backends.jax.memory.DeviceNeed`: bytes needed, available, largest variables).
    """

    def __init__(self, message: str, devices: list[Any] | None = None) -> None:
        super().__init__(message)
        self.devices = list(devices or [])


#: Exit code of a worker that `kmp.callbacks.StallWatchdog` stops (sysexits' EX_SOFTWARE):
#: the watchdog exits with it, the launcher reads it as a stall.
STALL_EXIT_CODE = 70


class UncheckedVersionError(RuntimeError):
    """kmp cannot verify its changes to Keras/TensorFlow on the installed versions.

    Raised when a distributed strategy is set up (`@kmp.parallelize`,
    `kmp.compat.patch_keras()`), before any training: a patch without which training
    gives other numbers than one device was not checked for these versions, or a private
    name kmp relies on is at none of its known places (`kmp.compat.report()` says which).
    Also `kmp.compat.UncheckedVersionError`.
    """
class KerasTooOldError(RuntimeError):
    """The installed Keras predates the oldest one kmp distributes with (Keras 3.10), on any
    lane: raised where kmp starts to distribute, naming the upgrade (`compat._policy`)."""


#: Exit code of a job that a stop signal stopped after `kmp.callbacks.BackupAndRestore` saved
#: its state at the step every worker agreed on (sysexits' EX_TEMPFAIL: "try again later"):
#: run the same command again to resume. Schedulers requeue on it (docs/preemption.md).
STOPPED_EXIT_CODE = 75


class TrainingStopped(SystemExit):
    """A stop signal (SIGTERM, SIGUSR1) ended training; raised on every worker.

    A `SystemExit`: it leaves the script without a traceback (every `finally`
    runs) and the process exits with `code`: `STOPPED_EXIT_CODE` (75) when
    `kmp.callbacks.BackupAndRestore` saved the state of the step the workers
    agreed on, else `128 + signal number` (143 for SIGTERM), as a process ended
    by that signal reports it.

    Attributes:
        signal: Name of the signal (`"SIGTERM"`).
        saved: Whether a backup holds the state at the step training stopped.
        epoch: The epoch to resume (0-based), where saved, else `None`.
        batches_done: Batches of that epoch already trained, where saved, else `None`.
        backup_dir: Where the backup is, where saved, else `None`.
        received: Whether this process received the signal (else it learnt it from
            another worker, in the agreement).
        message: What happened and what to do, as printed.
    """

    def __init__(self, message: str, *, signal: str, saved: bool, code: int,
                 epoch: int | None = None, batches_done: int | None = None,
                 backup_dir: str | None = None, received: bool = True) -> None:
        super().__init__(code)
        self.message, self.signal, self.saved = message, signal, saved
        self.epoch, self.batches_done, self.backup_dir = epoch, batches_done, backup_dir
        self.received = received

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled whole (its arguments are keyword-only, which `BaseException`'s pickling
        loses): Ray Train sends a worker's exception to its controller, which failed to rebuild
        it (`TypeError: ... missing 3 required keyword-only arguments`)."""
        return _rebuild_stopped, (type(self), self.record())

    def record(self) -> dict[str, Any]:
        """Its attributes as plain values (what a worker reports to the launcher)."""
        return {"message": self.message, "signal": self.signal, "saved": self.saved,
                "code": self.code, "epoch": self.epoch, "batches_done": self.batches_done,
                "backup_dir": self.backup_dir, "received": self.received}


def _rebuild_stopped(cls: type[TrainingStopped], record: dict[str, Any]) -> TrainingStopped:
    """A `TrainingStopped` from its `record()` (its unpickling)."""
    record = dict(record)
    return cls(record.pop("message"), **record)
