"""This process's readings as one vector: the host, then each device; a failing sampler reads NaN."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

import numpy as np

from keras_mgpu_plugins.samplers import records as rec
from keras_mgpu_plugins.samplers.base import DEVICE_FIELDS, HOST_FIELDS, DeviceSampler

logger = logging.getLogger("keras_mgpu_plugins")


class Reader:
    """Reads a host sampler and a device sampler into one vector (`records.reading_vector`).

    `read()` and `reset_peaks()` never raise: a sampler that raises, or returns
    something that is not a reading, gives NaN for its fields in that reading
    (the other sampler's fields are kept), and the failure is counted. Under
    several workers that keeps a broken sampler on one worker from stopping it
    before a collective the others wait in, and from stopping training. The
    first failure is logged (once per `Reader`), with the error;
    `take_failures()` tells how many happened since it was last called.
    Thread-safe: `read()` runs on the sampler thread and the training thread.

    Args:
        device: The device sampler.
        host: The host sampler (`sample()` → `{field: value}`, `reset_peaks()`).
        owner: What the warning names as the reader.
    """

    def __init__(self, device: DeviceSampler, host: object, owner: str = "DeviceMetricsLogger") -> None:
        self.device, self.host, self.owner = device, host, owner
        self.names = list(device.devices())
        self._lock = threading.Lock()
        self._failures = 0
        self._warned = False

    def read(self) -> np.ndarray:
        host = self._attempt("the host", lambda: rec.reading_vector(self.host.sample(), {}, ()),
                             len(HOST_FIELDS))
        devices = self._attempt(
            "the devices",
            lambda: rec.reading_vector({}, self.device.sample(), self.names)[len(HOST_FIELDS):],
            len(DEVICE_FIELDS) * len(self.names),
        )
        return np.concatenate([host, devices])

    def reset_peaks(self) -> None:
        """Starts new peak windows; a sampler that cannot is counted as a failure."""
        self._attempt("the devices' peak memory (reset)", self.device.reset_peaks, 0)
        self._attempt("the host's peak memory (reset)", self.host.reset_peaks, 0)

    def take_failures(self) -> int:
        """Failed reads and resets since the last call."""
        with self._lock:
            count, self._failures = self._failures, 0
        return count

    def unavailable(self) -> str | None:
        """What this process cannot report at all (no GPU, no NVML), or `None`."""
        if not self.names:
            return f"{self.owner}: no GPU found; GPU metrics unavailable, reporting host metrics only."
        error = getattr(self.device, "nvml_error", None)
        if error:
            return f"{self.owner}: GPU utilisation, power and temperature unavailable: {error}."
        return None

    def _attempt(self, what: str, action: Callable[[], object], width: int) -> np.ndarray:
        try:
            result = action()
            return np.asarray(result, dtype=np.float64) if width else np.empty(0)
        except Exception as err:  # noqa: BLE001 - monitoring must not stop training
            with self._lock:
                self._failures += 1
                first, self._warned = not self._warned, True
            if first:
                logger.warning(
                    "%s: reading %s failed (%s: %s); its values are NaN in the records where a "
                    "reading fails, and training goes on. Later failures in this fit are not logged.",
                    self.owner, what, type(err).__name__, err,
                )
            return np.full(width, math.nan)
