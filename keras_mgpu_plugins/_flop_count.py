"""A model's counted FLOPs per training step, as every backend's counter reports them.

Backend-free: the counters live in `backends/<name>/flops.py` (XLA's cost analysis on JAX,
TensorFlow's graph profiler, torch's `FlopCounterMode`); `DeviceMetricsLogger` reads a
`FlopCount` and never knows which counted it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

NAN = math.nan


class FlopCount(NamedTuple):
    """What one count found.

    Attributes:
        flops_per_sample: FLOPs of one training step's forward and backward pass, per row
            of its batch (NaN when not counted).
        tokens_per_sample: Tokens per row where the inputs are token sequences (an integer
            input of shape `(batch, length)`: `length`), else NaN.
        rows: Rows of the batch it was counted at (on JAX the global batch), or NaN.
        method: How it was counted, for the summary.
        reason: Why it was not counted (`None` when it was).
    """

    flops_per_sample: float = NAN
    tokens_per_sample: float = NAN
    rows: float = NAN
    method: str = ""
    reason: str | None = None

    @classmethod
    def absent(cls, reason: str, tokens: float = NAN, rows: float = NAN) -> FlopCount:
        return cls(NAN, tokens, rows, "", reason)


def tokens_per_sample(leaves: Iterable[tuple[tuple, str]]) -> float:
    """The sequence length of the longest integer input of rank 2 (`(batch, length)`: token
    ids), from `(shape, dtype name)` pairs of the model's inputs; NaN where none is."""
    lengths = [shape[1] for shape, dtype in leaves
               if len(shape) == 2 and ("int" in dtype) and shape[1] is not None]
    return float(max(lengths)) if lengths else NAN


def per_sample(flops: float | None, rows: int | None, method: str, tokens: float = NAN,
               what: str = "the step") -> FlopCount:
    """A `FlopCount` from `flops` counted for a batch of `rows` (not counted: zero or none)."""
    if not rows:
        return FlopCount.absent(f"{what}'s batch size could not be read", tokens)
    if flops is None or not flops > 0:
        return FlopCount.absent(f"{method} counted no FLOPs in {what}", tokens, float(rows))
    return FlopCount(float(flops) / rows, tokens, float(rows), method)


def guarded(count: Callable[..., FlopCount], *args: Any) -> FlopCount:
    """`count(*args)`; a count that raises is a count not made (training goes on), with why."""
    try:
        return count(*args)
    except Exception as err:  # noqa: BLE001 - monitoring must not stop training
        return FlopCount.absent(f"counting failed: {type(err).__name__}: {err}")
