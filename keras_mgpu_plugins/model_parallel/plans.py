"""The placement of each model a backend's model-parallel builder placed.

The builders (`"model_parallel"`, `"hybrid"`) write here; `placement_report` and the
backend's own patches read. Backend-free, so that the report never imports a builder
and no builder imports the report's callers back.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Placed:
    """How one model was placed.

    Attributes:
        plan: The backend's plan: `.calls` (each with `.label`, `.device`, `.layer`,
            `.node`), `.devices`, `.micro_batches`.
        canonical: The backend's spelling of a device name (`"/device:GPU:1"`).
        workers: Workers that each hold the whole model (`"hybrid"`), else 1.
        worker_index: This worker's index among them.
    """

    plan: Any
    canonical: Callable[[str], str]
    workers: int = 1
    worker_index: int = 0


_PLACED: weakref.WeakKeyDictionary[Any, Placed] = weakref.WeakKeyDictionary()


def record(model: Any, placed: Placed) -> None:
    """Notes how `model` was placed (called by the builder that placed it)."""
    _PLACED[model] = placed


def set_workers(model: Any, workers: int, worker_index: int) -> None:
    """Notes that `model` is one of `workers` copies (`"hybrid"`), this one `worker_index`."""
    placed = _PLACED[model]
    placed.workers, placed.worker_index = workers, worker_index


def of(model: Any) -> Placed | None:
    """How `model` was placed, or `None` if no builder placed it."""
    return _PLACED.get(model)
