"""Contiguous stages: split an ordered list of costs over devices (pure, no TensorFlow)."""

from __future__ import annotations

from collections.abc import Sequence


def split_contiguous(costs: Sequence[float], n_stages: int) -> list[int]:
    """Splits ordered costs into `n_stages` contiguous, non-empty stages.

    Minimises the largest stage's cost; among splits with the same largest cost,
    the one with the smallest sum of squared stage costs (the most even) wins,
    and then the earliest boundaries. Items keep their order: stage `k` holds
    items before those of stage `k + 1`, so values cross devices only at the
    `n_stages - 1` boundaries.

    Args:
        costs: Non-negative cost of each item, in execution order.
        n_stages: Number of stages (devices), at least 1.

    Returns:
        The stage index of each item, e.g. `[0, 0, 1, 1]` for 4 equal costs on 2.

    Raises:
        ValueError: If `n_stages` is not positive, exceeds the number of items,
            or a cost is negative.

    Example:
        >>> split_contiguous([1.0] * 8, 4)
        [0, 0, 1, 1, 2, 2, 3, 3]
    """
    n = len(costs)
    if not isinstance(n_stages, int) or n_stages < 1:
        raise ValueError(f"n_stages must be a positive integer. Received: n_stages={n_stages!r}")
    if n_stages > n:
        raise ValueError(
            f"More stages than layers: {n_stages} devices for {n} layer calls to place. "
            f"Pass at most {n} devices, or a model with more layers."
        )
    if any(c < 0 for c in costs):
        raise ValueError(f"costs must be non-negative. Received: costs={list(costs)!r}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = (float("inf"), float("inf"))
    # best[k][i]: (max, sum of squares) splitting the first i items into k stages.
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, n_stages + 1):
        for i in range(k, n - (n_stages - k) + 1):
            for j in range(k - 1, i):
                prev = best[k - 1][j]
                if prev == inf:
                    continue
                stage = prefix[i] - prefix[j]
                cand = (max(prev[0], stage), prev[1] + stage * stage)
                if _better(cand, best[k][i]):
                    best[k][i], cut[k][i] = cand, j
    stages = [0] * n
    i = n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        for t in range(j, i):
            stages[t] = k - 1
        i = j
    return stages


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    tol = 1e-9 * max(1.0, abs(b[0]) if b[0] != float("inf") else 1.0)
    if a[0] < b[0] - tol:
        return True
    if a[0] > b[0] + tol:
        return False
    return a[1] < b[1] - tol * max(1.0, a[1])


def bubble_fraction(n_stages: int, micro_batches: int) -> float:
    """The idle share of a pipelined step: `(S - 1) / (M + S - 1)` (GPipe).

    Args:
        n_stages: Number of stages S.
        micro_batches: Number of micro-batches M.

    Returns:
        The fraction of each device's step time spent waiting, 0 for one stage.
    """
    if n_stages < 1 or micro_batches < 1:
        raise ValueError(
            f"n_stages and micro_batches must be positive. Received: n_stages={n_stages!r}, "
            f"micro_batches={micro_batches!r}"
        )
    return (n_stages - 1) / (micro_batches + n_stages - 1)
