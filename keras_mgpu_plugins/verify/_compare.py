"""The comparison itself: pure functions of the runs' records (plain values, no Keras).

Each figure (a log key over the recorded steps, the epoch logs, the variables after each
step and at the end, `evaluate`, `predict`) gets its largest difference between the
parallel run and the reference run, and its noise: the same difference between the noise
run (one device, each batch's rows reversed) and the reference. A figure is within noise
when its difference is at most `FACTOR` times its noise, or `FLOOR` where that is larger;
a tolerance given by the user replaces both. The first step at which a log or the
variables leave the noise is where the runs part; the variables that differ most there
are named.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

#: A figure may differ by this many times its own noise (the project's rule: 10 x).
FACTOR = 10.0
#: ... and by this much at least (float32 rounding of values near 1).
FLOOR = 1e-6


@dataclasses.dataclass
class Row:
    """One figure of the table."""

    figure: str
    count: int  # steps, variables, keys or outputs compared
    difference: float
    noise: float | None
    tolerance: float

    @property
    def within(self) -> bool:
        return self.difference <= self.tolerance


@dataclasses.dataclass
class Comparison:
    rows: list[Row]
    first_step: int | None = None  # where a log or the variables left the noise
    first_what: str = ""  # which logs / "variables" parted there
    parted_keys: list[str] = dataclasses.field(default_factory=list)
    top_variables: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    steps: int = 0

    @property
    def equal(self) -> bool:
        return all(row.within for row in self.rows)


def _diff(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    both_nan = np.isnan(a) & np.isnan(b)
    d = np.abs(np.where(both_nan, 0.0, a - b))
    return float(np.nanmax(np.where(np.isnan(d), np.inf, d)))


def _tolerance(noise: float | None, given: float | None) -> float:
    if given is not None:
        return given
    return max(FACTOR * (noise or 0.0), FLOOR)


def _by_key(records: list[dict]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for entry in records:
        for key, value in entry["logs"].items():
            found.setdefault(key, []).append(value)
    return found


def _vars_diff(a: dict, b: dict) -> dict[str, float]:
    return {k: _diff(a[k], b[k]) if k in b else math.inf for k in a}


def compare(reference: dict, parallel: dict, noise: dict | None,
            tolerance: float | None) -> Comparison:
    """The table and the parting point (see the module docstring). The records come from
    `_recorder.Record`; the caller checked they can be compared (`_checks`)."""
    steps = min(len(reference["steps"]), len(parallel["steps"]))
    noisy = noise is not None and len(noise["steps"]) >= steps
    ref, par = reference["steps"][:steps], parallel["steps"][:steps]
    counted = (len(reference["steps"]), len(parallel["steps"]))
    rows, log_tol = [Row("training steps recorded", counted[0],
                         float(abs(counted[0] - counted[1])), None, 0.0)], {}
    ref_logs, par_logs = _by_key(ref), _by_key(par)
    noise_logs = _by_key(noise["steps"][:steps]) if noisy else {}
    for key, values in ref_logs.items():
        level = _diff(noise_logs[key], values) if key in noise_logs else None
        log_tol[key] = _tolerance(level, tolerance)
        rows.append(Row(key, steps, _diff(par_logs.get(key, [math.nan] * steps), values),
                        level, log_tol[key]))
    var_noise = max((max(_vars_diff(n["variables"], r["variables"]).values(), default=0.0)
                     for n, r in zip(noise["steps"][:steps], ref, strict=False)),
                    default=0.0) if noisy else None
    var_tol = _tolerance(var_noise, tolerance)
    step_vars = [_vars_diff(p["variables"], r["variables"]) for p, r in zip(par, ref,
                                                                           strict=True)]
    rows.append(Row("variables, after each step", steps,
                    max((max(d.values(), default=0.0) for d in step_vars), default=0.0),
                    var_noise, var_tol))
    result = Comparison(rows=rows, steps=steps)
    _parting(result, ref, par, log_tol, step_vars, var_tol)
    _ends(result, reference, parallel, noise, tolerance)
    return result


def _parting(result: Comparison, ref: list, par: list, log_tol: dict, step_vars: list,
             var_tol: float) -> None:
    for i, (r, p) in enumerate(zip(ref, par, strict=True)):
        keys = [k for k, v in r["logs"].items()
                if _diff(p["logs"].get(k, math.nan), v) > log_tol[k]]
        worst = max(step_vars[i].values(), default=0.0)
        if keys or worst > var_tol:
            result.first_step = r["step"]
            result.parted_keys = keys
            result.first_what = ", ".join(keys + (["variables"] if worst > var_tol else []))
            ranked = sorted(step_vars[i].items(), key=lambda kv: -kv[1])
            result.top_variables = ranked[:3]
            return


def _ends(result: Comparison, reference: dict, parallel: dict, noise: dict | None,
          tolerance: float | None) -> None:
    """The rows after the steps: epoch logs, final variables, evaluate, predict."""
    epochs = min(len(reference["epochs"]), len(parallel["epochs"]))
    if epochs:
        ref_e, par_e = reference["epochs"][:epochs], parallel["epochs"][:epochs]
        noise_e = noise["epochs"][:epochs] if noise and len(noise["epochs"]) >= epochs else None
        for key in [k for k in ref_e[-1]["logs"] if k.startswith("val_")]:
            values = [e["logs"].get(key, math.nan) for e in ref_e]
            level = (_diff([e["logs"].get(key, math.nan) for e in noise_e], values)
                     if noise_e else None)
            result.rows.append(Row(f"{key} (epoch end)", epochs,
                                   _diff([e["logs"].get(key, math.nan) for e in par_e], values),
                                   level, _tolerance(level, tolerance)))
    if reference.get("final") and parallel.get("final"):
        for label, optimizer in (("model variables, at the end", False),
                                 ("optimizer variables, at the end", True)):
            names = [k for k in reference["final"] if k.startswith("optimizer/") == optimizer]
            if not names:
                continue
            diff = _vars_diff({k: reference["final"][k] for k in names}, parallel["final"])
            level = (max(_vars_diff({k: reference["final"][k] for k in names},
                                    noise["final"]).values(), default=0.0)
                     if noise and noise.get("final") else None)
            result.rows.append(Row(label, len(names), max(diff.values(), default=0.0), level,
                                   _tolerance(level, tolerance)))
    if reference.get("evaluate") is not None and parallel.get("evaluate") is not None:
        noise_eval = noise.get("evaluate") if noise else None
        for key, value in reference["evaluate"].items():
            level = _diff(noise_eval[key], value) if noise_eval and key in noise_eval else None
            result.rows.append(Row(f"evaluate {key}", 1,
                                   _diff(parallel["evaluate"].get(key, math.nan), value),
                                   level, _tolerance(level, tolerance)))
    if reference.get("predict") is not None and parallel.get("predict") is not None:
        def most(a: list, b: list) -> float:
            if len(a) != len(b):
                return math.inf
            return max((_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)

        level = (most(noise["predict"], reference["predict"])
                 if noise and noise.get("predict") is not None else None)
        result.rows.append(Row("predict", sum(int(np.size(p)) for p in reference["predict"]),
                               most(parallel["predict"], reference["predict"]), level,
                               _tolerance(level, tolerance)))


def workers_agree(records: dict[int, dict], index: int) -> Row | None:
    """With several processes: the largest difference between worker 0's fit `index` and
    another worker's (logs at each step, variables at the end); they must be equal."""
    if len(records) < 2:
        return None
    first = records[0]["fits"][index]
    worst = 0.0
    for worker, record in records.items():
        if worker == 0:
            continue
        other = record["fits"][index] if index < len(record["fits"]) else None
        if other is None or len(other["steps"]) != len(first["steps"]):
            return Row("every process logs and holds the same", len(records), math.inf,
                       None, 0.0)
        for a, b in zip(first["steps"], other["steps"], strict=True):
            worst = max(worst, *(_diff(b["logs"].get(k, math.nan), v)
                                 for k, v in a["logs"].items()), 0.0)
        if first.get("final") and other.get("final"):
            worst = max(worst, *_vars_diff(first["final"], other["final"]).values(), 0.0)
    return Row("every process logs and holds the same", len(records), worst, None, 0.0)
