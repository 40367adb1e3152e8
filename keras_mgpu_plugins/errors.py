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
