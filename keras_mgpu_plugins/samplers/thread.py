"""Sampling off the training thread, at a fixed interval."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

logger = logging.getLogger("keras_mgpu_plugins")


class SamplerThread:
    """Calls `read()` every `interval` seconds on a daemon thread.

    Each reading (a 1-D float array) joins the current window, which the
    training thread takes with `drain()`, and the run's series (for plots),
    which is thinned (every other point dropped, then every second reading
    kept, and so on) when it exceeds `max_points`, so memory stays bounded on
    long runs. `sample_now()` reads synchronously, e.g. at an epoch's end.
    `new_window(reset)` starts a window after a reset of what is read (peak
    memory): a reading taken before the reset returned, even one in flight
    while it ran, is kept in the series but never joins the new window. A
    `read()` that raises is reported once and the thread stops; training goes on.

    Args:
        read: Returns one reading.
        interval: Seconds between readings, or `None` for no thread
            (`sample_now()` only).
        clock: Monotonic clock, in seconds.
        max_points: Most points kept in the run's series.
    """

    def __init__(
        self,
        read: Callable[[], np.ndarray],
        interval: float | None,
        clock: Callable[[], float] = time.perf_counter,
        max_points: int = 4096,
    ) -> None:
        self._read = read
        self._interval = interval
        self._clock = clock
        self._max_points = max_points
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window: list[np.ndarray] = []
        self._times: list[float] = []
        self._series: list[np.ndarray] = []
        self._stride = 1
        self._count = 0
        self._generation = 0  # bumped by new_window(); older readings leave the window

    def start(self) -> None:
        if self._interval is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kmp-device-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * (self._interval or 0)))
            self._thread = None

    def sample_now(self) -> np.ndarray:
        """Reads now, on the calling thread; the reading joins window and series."""
        with self._lock:
            generation = self._generation
        value = np.asarray(self._read(), dtype=np.float64)
        now = self._clock()
        with self._lock:
            if generation == self._generation:  # else it began before a new_window()
                self._window.append(value)
            self._count += 1
            if self._count % self._stride == 0:
                self._times.append(now)
                self._series.append(value)
                if len(self._series) > self._max_points:
                    self._times, self._series = self._times[::2], self._series[::2]
                    self._stride *= 2
        return value

    def new_window(self, reset: Callable[[], None] | None = None) -> None:
        """Calls `reset()`, then empties the window; readings begun before now never join it.

        Called at an epoch's start with the samplers' `reset_peaks`: a reading
        taken after the previous record (e.g. during a later callback's
        checkpoint save) still holds the old peak and must not count in the new
        epoch, and neither may one that was in flight while the peaks were reset.
        """
        if reset is not None:
            reset()
        with self._lock:
            self._generation += 1
            self._window = []

    def drain(self) -> np.ndarray:
        """The readings since the last drain, as a `(readings, fields)` array."""
        with self._lock:
            window, self._window = self._window, []
        return np.stack(window) if window else np.empty((0, 0))

    def series(self) -> tuple[np.ndarray, np.ndarray]:
        """The run's readings: times `(points,)` and values `(points, fields)`."""
        with self._lock:
            if not self._series:
                return np.empty(0), np.empty((0, 0))
            return np.asarray(self._times), np.stack(self._series)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sample_now()
            except Exception as err:  # noqa: BLE001 - a sampler must never stop training
                logger.warning("Device sampling stopped: %s: %s", type(err).__name__, err)
                return
