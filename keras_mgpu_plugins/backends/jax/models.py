"""The models `@kmp.parallelize` built on JAX, and the distribution each runs under.

kmp never leaves its distribution set for the whole process: a model it built runs
under its own distribution in its `fit`, `evaluate`, `predict`, `compile` and
`*_on_batch` (`backends.jax.methods`); everything else (another model, a model
loaded on one process, saving and loading) runs as in plain Keras. This registry
holds the models weakly, and imports nothing, so every module may ask it.
"""

from __future__ import annotations

import weakref
from typing import Any


class Arranged:
    """What kmp keeps for one model: its distribution; whether a batch that does not divide
    over the devices may be fed whole to every device (`backends.jax.batches`)."""

    def __init__(self, distribution: Any, partial: bool) -> None:
        self.distribution, self.partial = distribution, partial


_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_last: list[Any] = []  # the distribution of the last model kmp built (one entry)


def register(model: Any, distribution: Any, partial: bool) -> None:
    _MODELS[model] = Arranged(distribution, partial)
    _last[:] = [distribution]


def arranged(model: Any) -> Arranged | None:
    """What kmp keeps for `model` (`None`: a model kmp did not build)."""
    try:
        return _MODELS.get(model)
    except TypeError:  # not weakly referenceable: not one of kmp's
        return None


def distribution_of(model: Any) -> Any:
    """The distribution kmp runs `model` under (`None` for a model kmp did not build)."""
    found = arranged(model)
    return found.distribution if found is not None else None


def last_distribution() -> Any:
    """The distribution of the last model kmp built in this process (`None` before any)."""
    return _last[0] if _last else None
