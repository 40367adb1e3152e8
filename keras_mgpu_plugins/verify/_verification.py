"""The verification itself: the runs (`_runs`), then the report (`_checks`, `_compare`,
`_causes`, `_report`). `kmp.verify` and `kmp-verify` call `run`."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from typing import Any

from keras_mgpu_plugins.verify._report import CANNOT, DIFFER, EQUAL, VerifyReport

#: Training steps of each compared fit recorded by default.
DEFAULT_STEPS = 32
#: The seed every run starts from.
SEED = 1337
#: Noise above this (a figure's difference in the noise run) makes its tolerance weak: said.
LOUD_NOISE = 1e-3


def check(num_workers: Any, steps: Any, tolerance: Any, timeout: Any,
           random_layers: Any = "one_device", fits: Any = 1) -> None:
    if isinstance(fits, bool) or not isinstance(fits, int) or fits < 1:
        raise ValueError(f"fits must be a positive integer. Received: fits={fits!r}")
    if random_layers not in ("one_device", "script"):
        raise ValueError('random_layers must be "one_device" or "script". Received: '
                         f"random_layers={random_layers!r}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 2:
        raise ValueError("num_workers must be an integer of at least 2 (the devices or "
                         f"processes compared with one device). Received: num_workers={num_workers!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer. Received: steps={steps!r}")
    if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(
            tolerance, (int, float)) or not tolerance >= 0):
        raise ValueError("tolerance must be a number of at least 0, or None (the measured "
                         f"noise). Received: tolerance={tolerance!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds or None. Received: "
                         f"timeout={timeout!r}")


def backend_name() -> str:
    """The Keras backend the runs will use, read as Keras reads it, without importing it."""
    name = os.environ.get("KERAS_BACKEND")
    if name:
        return name
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as f:
            return json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


def run(target: Any, num_workers: int, *, steps: int, tolerance: float | None,
        processes: bool, json_path: str | None, timeout: float | None,
        log_dir: str | None, random_layers: str = "one_device", fits: int = 1) -> VerifyReport:
    """The verification of `target` (a `_runs.Target`): the runs, then the report."""
    from keras_mgpu_plugins.launch._common import resolve_stall_timeout
    from keras_mgpu_plugins.verify import _checks, _runs

    started = time.monotonic()
    backend = backend_name()
    log_dir = log_dir or tempfile.mkdtemp(prefix="kmp-verify-")
    stall = resolve_stall_timeout("auto")
    with tempfile.TemporaryDirectory(prefix="kmp-verify-records-") as folder:
        configs = _runs.plan(num_workers, processes, backend, tolerance is None, steps,
                             folder, SEED, random_layers, fits)
        results = _runs.start(target, configs, timeout, log_dir, stall)
        off = _uncovered(results) if random_layers == "one_device" else []
        if off:  # random layers kmp cannot make draw as one device: again, turned off
            configs = [dataclasses.replace(c, random_off=tuple(off)) for c in configs]
            results = _runs.start(target, configs, timeout, os.path.join(log_dir, "off"),
                                  stall)
    report = VerifyReport(CANNOT, num_workers=num_workers,
                          processes=processes or backend == "torch", backend=backend,
                          log_dir=log_dir)
    if off:
        report.notes.append(
            f"the random layers {', '.join(off)} draw through functions kmp cannot draw as "
            "one device (categorical, shuffle, gamma, binomial, beta): every run compared "
            "them turned off (each passes its inputs on unchanged)")
    report.reasons = _checks.reasons(results)
    if not report.reasons:
        _compared(report, results, tolerance, backend, off)
    report.seconds = time.monotonic() - started
    if json_path:
        report.to_json(json_path)
    return report


def _uncovered(results: dict) -> list[str]:
    """The random layers that drew through a function kmp cannot draw as one device."""
    found: list[str] = []
    for result in results.values():
        for record in result.records.values():
            found += [name for name in record.get("uncovered", []) if name not in found]
    return found


def _compared(report: VerifyReport, results: dict, tolerance: float | None,
              backend: str, off: list[str]) -> None:
    from keras_mgpu_plugins.verify import _causes, _compare

    reference, parallel = results["reference"].chief, results["parallel"].chief
    noise = results["noise"].chief if "noise" in results else None
    fits = len(reference["fits"])
    report.verdict = EQUAL
    for index in range(fits):
        mine = parallel["fits"][index]
        comparison = _compare.compare(reference["fits"][index], mine,
                                      noise["fits"][index] if noise else None, tolerance)
        agree = _compare.workers_agree(results["parallel"].records, index)
        comparison.rows += [agree] if agree is not None else []
        label = f"fit {index + 1}: " if fits > 1 else ""
        report.steps += comparison.steps
        report.rows += [{**dataclasses.asdict(row), "figure": label + row.figure,
                         "within": row.within} for row in comparison.rows]
        report.notes += [n for n in mine["notes"] if n not in report.notes]
        facts = {**(mine.get("facts") or {}), "uncovered": parallel.get("uncovered", [])}
        drawing = [r["layer"] for r in facts.get("random_layers", [])
                   if r["draws"] and r["layer"] not in off]
        if facts.get("random_layers_as_one_device") and drawing:
            note = (f"random layers ({', '.join(drawing)}) draw one device's numbers in every "
                    "run (@kmp.parallelize(random_layers=\"one_device\"))")
            report.notes += [note] if note not in report.notes else []
        loud = [r for r in comparison.rows if r.noise is not None and r.noise > LOUD_NOISE]
        if loud:
            report.notes.append(
                f"{label}the noise run differs from one device by {loud[0].noise:.2g} in "
                f"{loud[0].figure}: the training amplifies float rounding (or draws numbers "
                "by the rows' order), so 10 times that noise proves little. Compare fewer "
                "steps (--steps) or give --tolerance.")
        if not comparison.equal:
            report.parts.append({"fit": index + 1, "step": comparison.first_step,
                                 "what": comparison.first_what,
                                 "variables": comparison.top_variables,
                                 "causes": _causes.likely(facts, comparison, backend)})
    if report.parts:
        first = report.parts[0]
        report.verdict, report.first_fit, report.first_step = DIFFER, first["fit"], first["step"]
        report.first_what, report.top_variables = first["what"], first["variables"]
        report.causes = first["causes"]
