"""What every benchmark script shares: `--quick`, `--rounds`, `--json`, and its results as JSON.

Each script of `benchmarks/` measures its sides in one run (alternating, median of
rounds) and reports:

- ratios, each "kmp against something" with the goal it is held to (`>=` or `<=` a figure,
  or none for a figure that is only reported), every round's value, and a line on how it was
  measured;
- rows: the other figures (samples/s, ms a step, bytes), for the reader.

`Report.write(path)` writes them as JSON (`benchmarks/run.py` collects them; the committed
ones, `benchmarks/results/*.json`, are rendered into docs/benchmarks.md by
`benchmarks/_docs.py`). `--quick` runs each script in seconds, to show that it runs and
prints its ratios: its values are not measurements.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import sys
import time
from typing import Any

#: The goals of issue 40: the plain framework path, a hand-written loop, a callback.
PLAIN, LOOP, CALLBACK = (">=", 0.99), (">=", 0.95), (">=", 0.99)


def add_arguments(parser: argparse.ArgumentParser, rounds: int | None = 5) -> None:
    """The options every script takes (`--rounds` where it alternates sides in rounds)."""
    parser.add_argument("--quick", action="store_true",
                        help="seconds, tiny sizes: shows that it runs, its values mean nothing")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds,
                            help=f"alternations of the sides compared (default {rounds})")
    parser.add_argument("--json", metavar="PATH", help="write the results there as JSON")


def median_ratio(first: list[float], second: list[float]) -> tuple[float, list[float]]:
    """The median over rounds of `first[i] / second[i]`, and each round's."""
    ratios = [a / b for a, b in zip(first, second, strict=True)]
    return statistics.median(ratios), ratios


def versions() -> dict[str, str | None]:
    """The versions of what a benchmark may run on, from the installed metadata (no import)."""
    found: dict[str, str | None] = {}
    for name in ("keras", "keras-nightly", "tensorflow", "jax", "torch"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


class Report:
    """The results of one run of one script."""

    def __init__(self, script: str, title: str, quick: bool) -> None:
        self.script, self.title, self.quick = script, title, quick
        self.ratios: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self._started = time.perf_counter()
        self._load = _load()
        self._date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def ratio(self, key: str, name: str, value: float | None, goal: tuple[str, float] | None,
              rounds: list[float] | None = None, detail: str = "") -> None:
        """One ratio, kmp against something (see the module docstring)."""
        self.ratios.append({"key": key, "name": name, "value": value,
                            "goal": list(goal) if goal else None, "met": met(value, goal),
                            "rounds": list(rounds or []), "detail": detail})

    def row(self, name: str, value: float | None, unit: str, detail: str = "") -> None:
        self.rows.append({"name": name, "value": value, "unit": unit, "detail": detail})

    def note(self, text: str) -> None:
        self.notes.append(text)

    def result(self) -> dict[str, Any]:
        import keras

        return {"script": self.script, "title": self.title, "date": self._date,
                "quick": self.quick, "seconds": round(time.perf_counter() - self._started, 1),
                "command": " ".join(["python", f"benchmarks/{self.script}.py",
                                     *map(shlex.quote, sys.argv[1:])]),
                "machine": {"platform": platform.platform(), "python": platform.python_version(),
                            "cpu_cores": os.cpu_count(), "load_average": [self._load, _load()],
                            "keras_backend": keras.backend.backend(), "versions": versions()},
                "ratios": self.ratios, "rows": self.rows, "notes": self.notes}

    def finish(self, path: str | None) -> dict[str, Any]:
        """Prints the ratios; writes the JSON to `path` where given. Returns the result."""
        result = self.result()
        print(f"\n{self.title} ({'--quick: values not meaningful, ' if self.quick else ''}"
              f"{result['seconds']:.0f} s, load average {result['machine']['load_average'][0]})")
        for r in self.ratios:
            print(f"  {r['name']}: {format_ratio(r['value'])}  goal {format_goal(r['goal'])}"
                  + (f"  rounds {', '.join(f'{x:.3f}' for x in r['rounds'])}" if r["rounds"] else ""))
        if path:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
        return result


def met(value: float | None, goal: tuple[str, float] | list | None) -> bool | None:
    """Whether `value` meets `goal` (`None`: no value, or no goal)."""
    if value is None or not goal:
        return None
    op, bound = goal
    return value >= bound if op == ">=" else value <= bound


def format_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def format_goal(goal: list | tuple | None) -> str:
    return "-" if not goal else f"{goal[0]} {goal[1]:g}"


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
