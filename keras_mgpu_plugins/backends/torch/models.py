"""The models `@kmp.parallelize` built on torch for several processes, and what kmp keeps
for each. Held weakly; imports nothing, so every module may ask it."""

from __future__ import annotations

import collections
import weakref
from typing import Any


class Arranged:
    """What kmp keeps for one model.

    Attributes:
        queue: What each batch kmp fed holds (`feeding.StepInfo`), in the order Keras
            reads them, until its step takes it.
        sync_batchnorm: Whether BatchNormalization's statistics span every process.
        pending_broadcast: The next step first gives every process rank 0's variables
            (the first step of each top-level fit, evaluate and predict).
        buffers: The non-trainable variables a training step writes (BatchNormalization's
            moving statistics, seed states), found at the first step of each fit, synced
            from rank 0 after every step; `None` until found.
        step_logs: Whether this fit's per-step logs are read (`methods`): else a training
            step leaves them this process's, and only the epoch's are reduced.
    """

    def __init__(self, sync_batchnorm: bool) -> None:
        self.queue: collections.deque = collections.deque()
        self.sync_batchnorm = sync_batchnorm
        self.pending_broadcast = True
        self.buffers: list | None = None
        self.step_logs = True


_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register(model: Any, sync_batchnorm: bool) -> Arranged:
    _MODELS[model] = found = Arranged(sync_batchnorm)
    return found


def arranged(model: Any) -> Arranged | None:
    """What kmp keeps for `model` (`None`: a model kmp did not build for several processes)."""
    try:
        return _MODELS.get(model)
    except TypeError:  # not weakly referenceable: not one of kmp's
        return None
