"""TensorFlow: every worker makes the same `fit`/`evaluate`/`predict` call, or every waiting
worker raises `CallsDifferError` (never a hang).

A model under a multi-worker strategy runs collectives in `fit`, `evaluate` and `predict`:
made on one worker only (`if kmp.topology().is_chief: model.evaluate(...)`), the call waits
for the others' part until TensorFlow gives up on a worker that ended ("UnavailableError:
Collective ops is aborted by: ... tasks are unhealthy", 12 to 20 s later), or meets another
call's collective ("Collective instance N expected type ..."), or waits forever. `install()` makes each of these calls first meet the other workers through
`runtime.calls.together`, in the key-value store of TensorFlow's coordination service
(`backends.tensorflow.store`), before any collective of the call: the same-callbacks check's
all-gather included (this wrapper is outside it). Keras's own `evaluate` inside `fit`
(validation, `_use_cached_eval_dataset=True`) is part of the `fit` call, not counted.

A model under no multi-worker strategy (loaded with `keras.models.load_model` outside the
strategy's scope, built without kmp) is not counted: the chief may save, load, predict
and train such a model alone. On JAX, kmp's own methods call `together` themselves
(`backends/jax/methods.py`); this patch is installed by the TensorFlow strategy only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.runtime import calls

METHODS = ("fit", "evaluate", "predict")


def install() -> None:
    """Applies the registered patch `same_calls_on_every_worker` (`kmp.compat.PATCHES`;
    `unpatch_keras()` undoes it). Idempotent; read at each call, so a model under no strategy
    spanning workers is unaffected."""
    from keras_mgpu_plugins.compat import _registry

    _registry.apply("same_calls_on_every_worker")


def wrap_methods() -> Callable[[], None]:
    """The patch itself: wraps `keras.Model.fit`, `evaluate` and `predict`; returns the undo."""
    import keras

    from keras_mgpu_plugins.compat._record import replace

    undo = [replace(keras.Model, name, _together(name, getattr(keras.Model, name)))
            for name in METHODS]
    return lambda: [each() for each in reversed(undo)]


def _together(name: str, original: Any) -> Any:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("_use_cached_eval_dataset"):  # fit's validation: within fit's call
            from keras_mgpu_plugins import runtime

            here = runtime.of(self, refuse_apart=False)  # (a model on one worker alone: no wait)
            calls.together(here, name, self)  # every worker, or all raise
        return original(self, *args, **kwargs)

    return method
