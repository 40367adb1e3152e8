"""A sampler that replays scripted readings: GPUs where there are none."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence


class ScriptedSampler:
    """Replays scripted device readings, one per `sample()` call.

    It stands in for `GPUSampler` behind the `DeviceSampler` interface, so the
    logic that turns GPU readings into logs, files and plots runs (and is
    tested) on machines without a GPU. After the last reading it repeats the
    last one. Peak memory behaves as TensorFlow's: the highest `memory_mb`
    returned since the last `reset_peaks()`, which restarts it from the
    current value (unless a reading scripts `peak_memory_mb` itself).

    Args:
        readings: One mapping per call: device name → `{field: value}`.

    Raises:
        ValueError: If `readings` is empty or its readings name different devices.

    Example:
        >>> sampler = ScriptedSampler([{"GPU:0": {"memory_mb": 100.0}},
        ...                            {"GPU:0": {"memory_mb": 300.0}}])
        >>> sampler.sample()["GPU:0"], sampler.sample()["GPU:0"]["peak_memory_mb"]
        ({'memory_mb': 100.0, 'peak_memory_mb': 100.0}, 300.0)
    """

    def __init__(self, readings: Sequence[Mapping[str, Mapping[str, float]]]) -> None:
        if not readings:
            raise ValueError(f"readings must hold at least one reading. Received: readings={readings!r}")
        names = list(readings[0])
        for reading in readings:
            if list(reading) != names:
                raise ValueError(
                    f"Every reading must name the same devices, in the same order ({names}). "
                    f"Received: a reading for {list(reading)}"
                )
        self._readings = [{d: dict(f) for d, f in r.items()} for r in readings]
        self._names = names
        self._lock = threading.Lock()
        self._peak: dict[str, float] = {}
        self._current: dict[str, float] = {}
        self.calls = 0
        self.resets = 0

    def devices(self) -> list[str]:
        return list(self._names)

    def sample(self) -> dict[str, dict[str, float]]:
        with self._lock:
            reading = self._readings[min(self.calls, len(self._readings) - 1)]
            self.calls += 1
            out = {}
            for name, fields in reading.items():
                fields = dict(fields)
                if "memory_mb" in fields:
                    self._current[name] = fields["memory_mb"]
                    self._peak[name] = max(self._peak.get(name, fields["memory_mb"]), fields["memory_mb"])
                    fields.setdefault("peak_memory_mb", self._peak[name])
                out[name] = fields
            return out

    def reset_peaks(self) -> None:
        with self._lock:
            self.resets += 1
            self._peak = dict(self._current)
