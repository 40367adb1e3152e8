"""The host sampler: this process's memory and CPU use (psutil), and TF's host allocator."""

from __future__ import annotations

import math
import sys
import threading

import psutil

from keras_mgpu_plugins.samplers.base import MB


class HostSampler:
    """Reads this process's resident memory and CPU use.

    `cpu_pct` is the process's CPU time over the wall time since the previous
    reading (100 = one core busy; several cores can make it exceed 100).
    `tf_memory_mb` / `tf_peak_memory_mb` are what TensorFlow's host allocator
    reports for `CPU:0` (shared by every logical CPU device); TensorFlow
    versions that do not report host memory leave them out.

    Example:
        >>> HostSampler().sample()["memory_mb"]
        812.5
    """

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._lock = threading.Lock()
        self._process.cpu_percent(None)  # the first call only starts the clock

    def sample(self) -> dict[str, float]:
        with self._lock, self._process.oneshot():
            reading = {
                "memory_mb": self._process.memory_info().rss / MB,
                "cpu_pct": float(self._process.cpu_percent(None)),
            }
        tf = sys.modules.get("tensorflow")
        if tf is not None:
            try:
                info = tf.config.experimental.get_memory_info("CPU:0")
                reading["tf_memory_mb"] = info["current"] / MB
                reading["tf_peak_memory_mb"] = info["peak"] / MB
            except (ValueError, RuntimeError, AttributeError):
                reading["tf_memory_mb"] = reading["tf_peak_memory_mb"] = math.nan
        return reading

    def reset_peaks(self) -> None:
        tf = sys.modules.get("tensorflow")
        if tf is not None:
            try:
                tf.config.experimental.reset_memory_stats("CPU:0")
            except (ValueError, RuntimeError, AttributeError):
                pass
