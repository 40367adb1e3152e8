"""The sampler interface: what a source of per-device readings provides."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

#: Fields of one device reading, with their units in the name. A sampler may
#: leave out fields it cannot read; they are then reported as missing.
DEVICE_FIELDS = ("memory_mb", "peak_memory_mb", "utilization_pct", "power_w", "temperature_c")

#: Fields of one host (process) reading.
HOST_FIELDS = ("memory_mb", "cpu_pct", "tf_memory_mb", "tf_peak_memory_mb")

#: How readings taken during a window are summarised into one value.
DEVICE_REDUCTIONS = {
    "memory_mb": "last",
    "peak_memory_mb": "max",
    "utilization_pct": "mean",
    "power_w": "mean",
    "temperature_c": "max",
}
HOST_REDUCTIONS = {
    "memory_mb": "last",
    "cpu_pct": "mean",
    "tf_memory_mb": "last",
    "tf_peak_memory_mb": "max",
}

MB = float(1 << 20)


@runtime_checkable
class DeviceSampler(Protocol):
    """A source of per-device readings (GPUs, or a stand-in for them in tests).

    `sample()` may be called from a background thread while `reset_peaks()` is
    called from the training thread; implementations must tolerate that.

    Example:
        >>> class OneFakeGPU:
        ...     def devices(self): return ["GPU:0"]
        ...     def sample(self): return {"GPU:0": {"memory_mb": 512.0}}
        ...     def reset_peaks(self): pass
        >>> isinstance(OneFakeGPU(), DeviceSampler)
        True
    """

    def devices(self) -> list[str]:
        """Names of the devices this sampler reads, e.g. `["GPU:0", "GPU:1"]`."""
        ...

    def sample(self) -> dict[str, dict[str, float]]:
        """One reading: device name → `{field: value}` (fields of `DEVICE_FIELDS`)."""
        ...

    def reset_peaks(self) -> None:
        """Starts a new peak-memory window (called at each epoch's start)."""
        ...
