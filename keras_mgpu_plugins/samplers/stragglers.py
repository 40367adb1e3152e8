"""Which worker holds the others back, and in which phase: a pure decision on numbers.

Every worker measures, per step, its time in three phases (`_step_phases`): waiting for
its input, running host code outside the step function (callbacks, the training loop's
Python), and inside the step function (the computation, and the wait for the other workers
in the step's collectives). A step that ends in a collective lasts as long as the slowest
worker needs to reach it: the others wait inside the step. So a worker whose *input* or
*host* time exceeds the others' by a clear margin holds them back by that much, and its
name and phase are what the chief reports. A worker that computes more slowly inside the
step cannot be told from the others by timing: every worker's step lasts until the same
collective ends, the others' time waiting in it counting as their compute phase. No worker
is then named; the compute phase's figures are logged for every worker all the same.

Input read ahead on another thread (TensorFlow's `tf.data` reads a Python input there)
counts only when reading a batch takes nearly the whole step (`INPUT_BOUND`): below that it
is hidden behind the step.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

PHASES = ("input", "host", "compute")
#: The codes of `straggler/phase` (0: no worker named); compute is never named (above).
PHASE_CODES = {"input": 1, "host": 2}
#: A clear margin: at least this many ms per step, and this share of a step.
MARGIN_MS, MARGIN_SHARE = 2.0, 0.2
#: Input read on another thread counts from this share of the step on.
INPUT_BOUND = 0.8


class Straggler(NamedTuple):
    """A worker named, the phase that holds it back, and the figures (ms per step)."""

    worker: int
    phase: str
    mine_ms: float
    others_ms: float
    excess_ms: float
    step_ms: float

    def describe(self) -> str:
        return (f"worker {self.worker} ({self.phase}: {self.mine_ms:.1f} ms a step against "
                f"{self.others_ms:.1f} ms on the others, +{self.excess_ms:.1f} ms = "
                f"{100 * self.excess_ms / max(self.step_ms, 1e-9):.0f}% of a "
                f"{self.step_ms:.1f} ms step)")


def margin_ms(step_ms: float) -> float:
    """The excess that counts as clear for steps of `step_ms`."""
    return max(MARGIN_MS, MARGIN_SHARE * step_ms)


def effective(phases_ms: np.ndarray, step_ms: np.ndarray) -> np.ndarray:
    """Each worker's `(input, host, compute)` ms per step as the decision counts them.

    Args:
        phases_ms: `(workers, 4)`: input on the training thread, host, compute, input read
            on other threads (ms per step).
        step_ms: Each worker's mean time per step.
    """
    phases_ms = np.asarray(phases_ms, dtype=np.float64).reshape(-1, 4)
    other = np.nan_to_num(phases_ms[:, 3])
    bound = other >= INPUT_BOUND * np.asarray(step_ms, dtype=np.float64)
    out = phases_ms[:, :3].copy()
    out[:, 0] = np.nan_to_num(out[:, 0]) + np.where(bound, other, 0.0)
    return out


def find(phases_ms: np.ndarray, step_ms: np.ndarray) -> list[Straggler]:
    """The workers that hold the others back by a clear margin, slowest first.

    Args:
        phases_ms: `(workers, 4)` ms per step (see `effective`); NaN where unmeasured.
        step_ms: `(workers,)` each worker's mean time per step.

    Returns:
        One `Straggler` per worker named (none with a single worker, or with no clear
        excess: the others' figure is their median).
    """
    step_ms = np.asarray(step_ms, dtype=np.float64).reshape(-1)
    workers = len(step_ms)
    if workers < 2 or not np.isfinite(step_ms).any():
        return []
    values = effective(phases_ms, step_ms)
    step = float(np.nanmedian(step_ms))
    margin = margin_ms(step)
    before = np.nan_to_num(values[:, 0]) + np.nan_to_num(values[:, 1])  # before the collective
    found = []
    for w in range(workers):
        others = np.delete(np.arange(workers), w)
        excess = before[w] - float(np.median(before[others]))
        if math.isfinite(excess) and excess > margin:
            phase, mine, theirs = _phase_excess(values, w, others, ("input", "host"))
            found.append(Straggler(w, phase, mine, theirs, excess, step))
    return sorted(found, key=lambda s: -s.excess_ms)


def _phase_excess(values: np.ndarray, w: int, others: np.ndarray,
                  phases: tuple[str, ...]) -> tuple[str, float, float]:
    """The phase in which worker `w` exceeds the others most: `(phase, its ms, theirs)`."""
    best = ("", math.nan, math.nan)
    best_excess = -math.inf
    for phase in phases:
        column = values[:, PHASES.index(phase)]
        if not np.isfinite(column[w]):
            continue
        theirs = float(np.nanmedian(column[others])) if np.isfinite(column[others]).any() else 0.0
        if column[w] - theirs > best_excess:
            best, best_excess = (phase, float(column[w]), theirs), column[w] - theirs
    return best


def verdict(stragglers: list[Straggler], phases_ms: np.ndarray, step_ms: np.ndarray) -> str:
    """One sentence: who holds the others back, or that no worker does (and by how little)."""
    if stragglers:
        named = "; ".join(s.describe() for s in stragglers)
        return f"held back by {named}."
    step_ms = np.asarray(step_ms, dtype=np.float64).reshape(-1)
    if len(step_ms) < 2:
        return "one worker: nothing to compare."
    values = effective(phases_ms, step_ms)
    before = values[:, 0] + np.nan_to_num(values[:, 1])
    step = float(np.nanmedian(step_ms))
    spread = float(np.nanmax(before) - np.nanmin(before)) if np.isfinite(before).any() else 0.0
    return (f"no worker holds the others back (input + host differ by {spread:.1f} ms at most, "
            f"under the margin of {margin_ms(step):.1f} ms for {step:.1f} ms steps).")
