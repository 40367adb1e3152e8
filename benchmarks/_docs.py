"""docs/benchmarks.md's figures, rendered from the committed `benchmarks/results/*.json`.

Each generated part of the page lies between two markers,

    <!-- results KEY -->
    ...
    <!-- /results KEY -->

where KEY is a result's name (`benchmarks/results/KEY.json`) or `summary` (every ratio of
every result, with its goal). `python benchmarks/run.py --update-docs` rewrites them;
`tests/unit/test_benchmark_docs.py` fails while the page differs from its rendering, or a
result has no place on the page.
"""

from __future__ import annotations

import glob
import json
import os
import re

from _suite import format_goal, format_ratio

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DOC = os.path.join(os.path.dirname(HERE), "docs", "benchmarks.md")
_SECTION = re.compile(r"(<!-- results (\S+) -->\n)(.*?)(<!-- /results \2 -->)", re.S)


def load(folder: str = RESULTS) -> dict[str, dict]:
    """Each committed result, by its key (the file's name)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path, encoding="utf-8") as f:
            found[os.path.basename(path)[: -len(".json")]] = json.load(f)
    return found


def _value(r: dict) -> str:
    text = format_ratio(r["value"])
    return text if r["met"] is not False else f"**{text}** (missed)"


def _measured(result: dict) -> str:
    m, v = result["machine"], result["machine"]["versions"]
    load = m["load_average"]
    stack = ", ".join(f"{k} {v[k]}" for k in ("keras", "keras-nightly", "tensorflow", "jax", "torch")
                      if v.get(k))
    return (f"`{result['command']}`: {result['date']}, {result['seconds']:.0f} s, "
            f"{m['cpu_cores']} CPU cores, load average {load[0]} at the start and {load[1]} at "
            f"the end; {stack}, Keras backend {m['keras_backend']}")


def render(key: str, result: dict) -> str:
    """One result: its ratios with their goals and rounds, its other figures, how it ran."""
    lines = ["| ratio | goal | measured | rounds | how |", "|---|---|---|---|---|"]
    for r in result["ratios"]:
        rounds = ", ".join(f"{x:.3f}" for x in r["rounds"])
        lines.append(f"| {r['name']} | {format_goal(r['goal'])} | {_value(r)} | {rounds} | "
                     f"{r['detail']} |")
    if result["rows"]:
        lines += ["", "| figure | value | |", "|---|---|---|"]
        for row in result["rows"]:
            value = "-" if row["value"] is None else f"{row['value']:,.4g} {row['unit']}"
            lines.append(f"| {row['name']} | {value} | {row['detail']} |")
    lines += ["", f"Measured by {_measured(result)}."]
    lines += [f"{note}" for note in result.get("notes", [])]
    return "\n".join(lines) + "\n"


def render_summary(results: dict[str, dict]) -> str:
    """Every ratio of every result, with its goal: the page's first table."""
    lines = ["| benchmark | ratio | goal | measured | date, load average |", "|---|---|---|---|---|"]
    for key, result in results.items():
        load = result["machine"]["load_average"]
        for r in result["ratios"]:
            lines.append(f"| [{key}](#{key}) | {r['name']} | "
                         f"{format_goal(r['goal'])} | {_value(r)} | {result['date'][:10]}, "
                         f"{load[0]}-{load[1]} |")
    return "\n".join(lines) + "\n"


def update(text: str, results: dict[str, dict]) -> str:
    """`text` (the page) with every marked part rendered again.

    Raises:
        ValueError: A marker names no result, or a result has no marker.
    """
    placed = set()

    def replace(match: re.Match) -> str:
        key = match.group(2)
        if key == "summary":
            body = render_summary(results)
        elif key in results:
            body = render(key, results[key])
        else:
            raise ValueError(f"docs/benchmarks.md marks results {key!r}: there is no "
                             f"benchmarks/results/{key}.json")
        placed.add(key)
        return match.group(1) + body + match.group(4)

    new = _SECTION.sub(replace, text)
    unplaced = sorted(set(results) - placed)
    if unplaced:
        raise ValueError(f"benchmarks/results holds {unplaced} but docs/benchmarks.md has no "
                         "'<!-- results KEY -->' part for them")
    return new


def update_file(doc: str = DOC, folder: str = RESULTS) -> bool:
    """Rewrites the page from the results; whether it changed."""
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    new = update(text, load(folder))
    if new != text:
        with open(doc, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text
