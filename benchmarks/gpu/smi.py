"""`nvidia-smi`, read as a second opinion beside NVML and JAX (no import of either).

`query()` reads fields once; `Poller` reads them every `interval` seconds on a thread
while something runs, so that its readings cover the same seconds as
`DeviceMetricsLogger`'s. Where `nvidia-smi` is missing (a CPU machine) both give
nothing, and say so.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from typing import Any

#: Fields of `nvidia-smi --query-gpu` that the run records.
FIELDS = ("index", "name", "driver_version", "memory.total", "memory.used",
          "utilization.gpu", "power.draw", "power.limit", "temperature.gpu",
          "clocks.sm", "clocks.mem", "pstate")
#: The fields a poller reads, numbers only.
POLLED = ("utilization.gpu", "power.draw", "memory.used")


def available() -> bool:
    return shutil.which("nvidia-smi") is not None


def parse(text: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """One dict per GPU from `--format=csv,noheader,nounits` output; numbers as floats,
    `None` for `[N/A]` / `[Not Supported]`, other text kept."""
    rows = []
    for line in text.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields):
            continue
        row: dict[str, Any] = {}
        for field, value in zip(fields, values, strict=True):
            if value.startswith("[") or value in ("N/A", ""):
                row[field] = None
                continue
            try:
                row[field] = float(value)
            except ValueError:
                row[field] = value
        rows.append(row)
    return rows


def query(fields: tuple[str, ...] = FIELDS, timeout: float = 20) -> list[dict[str, Any]] | None:
    """Every GPU's `fields` now, or `None` without `nvidia-smi`."""
    if not available():
        return None
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=timeout, check=True).stdout
    return parse(out, fields)


def device_slug(dry_run: bool) -> str:
    """The run's file name part: `"h200"` for an `NVIDIA H200`, `"cpu"` in a dry run."""
    if dry_run:
        return "cpu"
    try:
        gpus = query(("name",))
    except (subprocess.SubprocessError, OSError):
        gpus = None
    if not gpus or not isinstance(gpus[0].get("name"), str):
        return "unknown"
    words = gpus[0]["name"].lower().replace("nvidia", "").split()
    slug = "".join(c if c.isalnum() else "-" for c in words[0]) if words else ""
    return slug.strip("-") or "unknown"


class Poller:
    """Reads `POLLED` of GPU `index` every `interval` s from `start()` to `stop()`."""

    def __init__(self, index: int = 0, interval: float = 0.25) -> None:
        self.index, self.interval = index, interval
        self.readings: list[dict[str, Any]] = []
        self.error: str | None = None if available() else "nvidia-smi not found"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Poller:
        if self.error is None:
            self._thread = threading.Thread(target=self._loop, daemon=True, name="smi-poller")
            self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stops reading; the mean of each field over the readings (`None` where none)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"readings": len(self.readings), "error": self.error}
        for field in POLLED:
            values = [r[field] for r in self.readings if isinstance(r.get(field), float)]
            out[field] = statistics.fmean(values) if values else None
            if field == "memory.used":
                out["memory.used.max"] = max(values) if values else None
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                rows = query(("index", *POLLED), timeout=10) or []
                mine = [r for r in rows if r.get("index") == float(self.index)]
                if mine:
                    self.readings.append(mine[0])
            except (subprocess.SubprocessError, OSError) as err:
                self.error = f"{type(err).__name__}: {err}"
                return
            self._stop.wait(max(0.0, self.interval - (time.perf_counter() - start)))
