"""Whether the runs can be compared at all: the reasons for a verdict of "cannot compare".

A run that failed, a script that never called `fit` (or called it on a model
`@kmp.parallelize` did not build), a random source kmp cannot seed, or runs whose data,
fit settings or initial weights differ: each is a reason, named, never a pass. Pure
functions of the records (`_recorder.Record`) and the runs' failures.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The initial weights of the runs may differ by this much (the same seed draws the same).
INITIAL_TOLERANCE = 1e-6
_NAMES = {"reference": "one-device", "noise": "noise (one device, rows reversed)",
          "parallel": "parallel"}


def _first_lines(text: str, count: int = 12) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def reasons(runs: dict[str, Any]) -> list[str]:
    """Every reason the runs cannot be compared (empty: they can). `runs` maps a run's name
    to its `_runs.RunResult`."""
    found: list[str] = []
    records = {name: result.chief for name, result in runs.items()}
    for record in records.values():  # (a fit kmp refuses then fails the run)
        if record is not None and record["undecorated"]:
            found.append(_undecorated(record))
            break
    for name, result in runs.items():
        if result.failure:
            found.append(f"the {_NAMES[name]} run failed (its logs: {result.log_dir}):\n"
                         + _first_lines(result.failure))
    if found:
        return found
    for name, record in records.items():
        if record is None or record["fit_calls"] == 0:
            return [f"the script never called fit (in the {_NAMES[name]} run): kmp-verify "
                    "compares the first fit's steps. Call model.fit on the model your "
                    "@kmp.parallelize factory returns."]
        if record["undecorated"]:
            return [_undecorated(record)]
    unseedable = sorted({s for r in records.values() for s in r.get("unseedable", [])})
    if unseedable:
        found.append("the script reads a random source kmp cannot seed, so each run draws "
                     "other numbers: " + "; ".join(unseedable) + ". Give it a seed (kmp "
                     "seeds Python's random, NumPy's global generator and Keras's in every "
                     "run alike).")
    reference = records["reference"]
    clock = sorted({s for r in records.values() for s in r.get("clock", [])})
    hint = (f" The script reads the clock ({'; '.join(clock[:3])}): seeding from it gives "
            "each run other numbers." if clock else "")
    for name, record in records.items():
        if name == "reference":
            continue
        if len(record["fits"]) != len(reference["fits"]):
            found.append(f"the script calls fit {len(record['fits'])} time(s) in the "
                         f"{_NAMES[name]} run, {len(reference['fits'])} on one device.")
            continue
        for index, (mine, theirs) in enumerate(zip(record["fits"], reference["fits"],
                                                   strict=True)):
            which = "the first fit" if index == 0 else f"fit {index + 1}"
            found += _fit_reasons(which, _NAMES[name], mine, theirs, hint)
    if not found and not any(fit["steps"] for fit in reference["fits"]):
        found.append("the first fit trained no step: nothing to compare.")
    return list(dict.fromkeys(found))


def _undecorated(record: dict) -> str:
    return (f"fit was called on a model that @kmp.parallelize did not build "
            f"({record['undecorated'][0]}): kmp does not distribute it, so the parallel run "
            "would train it on one device (or refuses it). Decorate the factory that builds "
            "and compiles it with @kmp.parallelize.")


def _fit_reasons(which: str, run: str, record: dict, reference: dict, hint: str) -> list[str]:
    found = []
    if record["data"] != reference["data"]:
        found.append(f"{which} trains on other data in the {run} run than on one device "
                     f"(fingerprints {record['data']} and {reference['data']}): a random "
                     f"source kmp cannot seed, or data that depend on the device count.{hint}")
    settings = {k: (reference["settings"].get(k), v) for k, v in record["settings"].items()
                if k != "others" and reference["settings"].get(k) != v}
    if record["settings"].get("others") != reference["settings"].get("others"):
        settings["y, sample_weight or validation_data"] = ("", "")
    if settings:
        named = ", ".join(f"{k} ({a!r} on one device, {b!r} here)" if a != "" else k
                          for k, (a, b) in settings.items())
        found.append(f"{which} is called otherwise in the {run} run: {named}. kmp's "
                     f"batch_size is the global batch: leave it as on one device.{hint}")
    worst = _initial_difference(reference["initial"], record["initial"])
    if worst > INITIAL_TOLERANCE:
        found.append(f"{which} starts from other weights in the {run} run (largest "
                     f"difference {worst:.2g}): an initializer or a build that reads a random "
                     f"source kmp cannot seed.{hint}")
    return found


def _initial_difference(a: dict | None, b: dict | None) -> float:
    if a is None or b is None or a.keys() != b.keys():
        return float("inf") if (a is None) != (b is None) or (a and b) else 0.0
    diffs = [float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64))))
             if np.shape(a[k]) == np.shape(b[k]) and np.size(a[k]) else
             (0.0 if np.shape(a[k]) == np.shape(b[k]) else float("inf")) for k in a]
    return max(diffs, default=0.0)
