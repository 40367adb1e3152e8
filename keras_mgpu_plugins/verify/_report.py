"""`VerifyReport`: the verdict, the table, where the runs part and why, as text and JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

#: The verdicts, and the exit code of kmp-verify for each.
EQUAL, DIFFER, CANNOT = "equal", "differ", "cannot compare"
EXIT_CODES = {EQUAL: 0, DIFFER: 1, CANNOT: 1}


@dataclasses.dataclass
class VerifyReport:
    """What `kmp.verify` and `kmp-verify` found.

    Attributes:
        verdict: `"equal"` (every figure within float noise), `"differ"` or
            `"cannot compare"` (`reasons` says why).
        reasons: Why the runs cannot be compared (empty otherwise).
        num_workers: N: devices, or processes (`processes`).
        processes: Whether the parallel run had N processes (else N devices in one).
        backend: The Keras backend.
        steps: Training steps compared.
        rows: The table: per figure, `figure`, `count`, `difference`, `noise` (`None`
            when a tolerance was given), `tolerance`, `within`.
        first_fit: Which compared fit parted first (1: the first).
        first_step: The first step at which a log or the variables left the noise.
        first_what: What left it there (log keys, "variables").
        top_variables: The variables (layer/name) that differ most at that step, with
            their largest difference.
        causes: The likely causes, the likeliest first: `(key, sentence)`.
        parts: Every compared fit that differs (`fits` > 1): its `fit` number, `step`,
            `what`, `variables` and `causes`, as above for the first.
        notes: What the report says beside the verdict (random layers turned off, ...).
        seconds: Wall time of the verification.
        log_dir: Where the runs' outputs are.
    """

    verdict: str
    reasons: list[str] = dataclasses.field(default_factory=list)
    num_workers: int = 2
    processes: bool = False
    backend: str = ""
    steps: int = 0
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    first_fit: int | None = None
    first_step: int | None = None
    first_what: str = ""
    top_variables: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    causes: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    parts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    log_dir: str = ""

    @property
    def ok(self) -> bool:
        """Whether every figure is within float noise."""
        return self.verdict == EQUAL

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def largest_difference(self) -> float:
        return max((r["difference"] for r in self.rows), default=0.0)

    @property
    def largest_noise(self) -> float | None:
        levels = [r["noise"] for r in self.rows if r["noise"] is not None]
        return max(levels) if levels else None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["rows"] = [{k: (None if isinstance(v, float) and math.isinf(v) and k == "noise"
                             else v) for k, v in row.items()} for row in self.rows]
        return data

    def to_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, default=str, allow_nan=True)

    def __str__(self) -> str:
        where = (f"{self.num_workers} processes" if self.processes
                 else f"{self.num_workers} devices")
        head = (f"kmp-verify: one device against {where} ({self.backend}), "
                f"{self.steps} steps: {self.verdict.upper()}")
        lines = [head]
        if self.reasons:
            lines += ["", "Cannot compare:"] + [f"  - {r}".replace("\n", "\n    ")
                                                for r in self.reasons]
        if self.rows:
            lines += ["", _table(self.rows)]
        several = len(self.parts) > 1 or (self.first_fit or 1) > 1
        for part in self.parts or ([{"fit": self.first_fit, "step": self.first_step,
                                     "what": self.first_what, "variables": self.top_variables,
                                     "causes": self.causes}] if self.verdict == DIFFER else []):
            lines += ["", *_part(part, several)]
        lines += [f"Note: {n}" for n in self.notes]
        lines.append(f"({self.seconds:.0f} s; the runs' outputs: {self.log_dir})")
        return "\n".join(lines)


def _part(part: dict[str, Any], several: bool) -> list[str]:
    """The lines saying where one compared fit parts, and why."""
    fit = f"Fit {part['fit']}: t" if several else "T"
    lines = []
    if part["step"] is not None:
        lines.append(f"{fit}he runs part at step {part['step']} ({part['what']}).")
        if part["variables"]:
            lines.append("Variables that differ most there: " + ", ".join(
                f"{name} ({diff:.2g})" for name, diff in part["variables"]))
    elif several:
        lines.append(f"Fit {part['fit']}: the runs differ after the steps (below).")
    if part["causes"]:
        lines.append(f"Likely cause: {part['causes'][0][1]}.")
        lines += [f"Also present: {s}." for _, s in part["causes"][1:]]
    else:
        lines.append("kmp saw no known cause in the model.")
    return lines


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1e}" if value else "0"


def _table(rows: list[dict[str, Any]]) -> str:
    header = ("figure", "n", "largest difference", "noise", "tolerance", "within")
    body = [(r["figure"], str(r["count"]), _fmt(r["difference"]), _fmt(r["noise"]),
             _fmt(r["tolerance"]), "yes" if r["within"] else "NO") for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    render = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
              for line in [header, *body]]
    return "\n".join(render)
