"""The private Keras trainer API `DeviceMetricsLogger` times steps and counts FLOPs through.

`watch_steps` replaces `model.train_function` (made by `fit` before `on_train_begin`) on the
instance for one `fit`: every call is timed as the step (`_step_phases.CLOCK`), and the
first call of each train function Keras makes runs through the backend's FLOP counter
(`_backend.active().count_step_flops`: the shapes of its batch, and on torch the step
itself under `FlopCounterMode`), once per train function, not per step or per `fit`.
Where the backend dispatches asynchronously (JAX) its `step_pacer()` keeps one step in
flight, so that a step's time is the devices' and not the host's enqueuing.
"""

from __future__ import annotations

import weakref
from typing import Any

from keras_mgpu_plugins import _backend
from keras_mgpu_plugins._flop_count import FlopCount
from keras_mgpu_plugins._step_phases import CLOCK
from keras_mgpu_plugins.compat._private_uses import require

#: A count that found no FLOPs in a step (a step skipped on resuming): tried again, this often.
_ATTEMPTS = 3
#: Each train function's count (once per compiled step function, whatever the fits).
_counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Watch:
    """One `fit`'s watch of its train function: `count` once known, `undo()` at its end."""

    def __init__(self, model: Any, count: bool) -> None:
        self.model, self.original = model, model.train_function
        self.count: FlopCount | None = _counts.get(self.original) if count else None
        self._left = _ATTEMPTS if count and self.count is None else 0
        self.watched = self._watched  # one bound method, compared by identity in `undo`
        self._pace = _backend.active().step_pacer()
        model.train_function = self.watched
        CLOCK.watch()

    def _watched(self, *args: Any) -> Any:
        CLOCK.step_began()
        try:
            result = self._counting(args) if self._left else self.original(*args)
            if self._pace is not None:
                self._pace(result)  # the step before this one is done
            return result
        finally:
            CLOCK.step_ended()

    def _counting(self, args: tuple) -> Any:
        self._left -= 1
        result, found = _backend.active().count_step_flops(self.model, self.original, args)
        if found.reason is None or not self._left or "counted no FLOPs" not in found.reason:
            self._left = 0
            self.count = found
            _counts[self.original] = found
        return result

    def undo(self) -> None:
        CLOCK.unwatch()
        self._pace = None  # holds the last step's logs
        if vars(self.model).get("train_function") is self.watched:
            self.model.train_function = self.original


def watch_steps(model: Any, count: bool = True) -> Watch | None:
    """Times each step of the running `fit` and counts its FLOPs once (with `count`).

    Returns:
        The `Watch` (`None` where this Keras calls its train function otherwise: the
        fallback of private use `train_function_watched`, warned once).
    """
    if getattr(model, "train_function", None) is None or not require("train_function_watched"):
        return None
    return Watch(model, count)
