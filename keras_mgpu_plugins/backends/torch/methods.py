"""Keras's own `Model.fit`, `evaluate` and `predict` in a job of several torch processes.

The patch `torch_one_model_per_job` wraps them once, on `keras.Model`:

- a model `@kmp.parallelize` built for the job (`models`): every process must make the
  call (`runtime.calls`), the arguments (read as Keras's own `Model.fit` defines them) are
  arranged so each process feeds its part of every global batch (`inputs.arrays`,
  `feeding`), the settings torch cannot run alike are refused (`settings`), and the first
  step gives every process rank 0's state;
- any other model: Keras's own methods (a `fit` that would train a separate model on each
  process is refused by the neutral hook every lane has, `runtime.apart`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from keras_mgpu_plugins.backends.torch import collectives, feeding, models, threads
from keras_mgpu_plugins.inputs import arrays
from keras_mgpu_plugins.runtime import calls

_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD
_ARRANGED = {"fit": arrays.fit_arguments, "evaluate": arrays.evaluate_arguments,
             "predict": arrays.predict_arguments}


def wrap_methods() -> Any:
    """The patch: Keras's `Model.fit`/`evaluate`/`predict` as above; returns the undo."""
    import keras

    from keras_mgpu_plugins.compat._record import replace

    undo = [replace(keras.Model, name, _arranged(name, getattr(keras.Model, name)))
            for name in _ARRANGED]
    return lambda: [u() for u in reversed(undo)]


def _arranged(name: str, original: Any) -> Any:
    signature = _keras_signature(name)
    arrange = _ARRANGED[name]

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        threads.share_interop()  # the launcher's share, after the script's own setting
        found = models.arranged(self)
        if found is None:
            return original(self, *args, **kwargs)
        if kwargs.get("_use_cached_eval_dataset") or collectives.world()[1] == 1:
            return original(self, *args, **kwargs)  # fit's validation: already arranged
        from keras_mgpu_plugins.backends.torch import settings
        from keras_mgpu_plugins.backends.torch.runtime import TorchRuntime

        runtime = TorchRuntime()
        calls.together(runtime, name, self)  # every process, or all raise
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in signature.parameters}
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items()
                     if k != "self" and signature.parameters[k].kind != _VAR_KEYWORD}
        settings.check(self, name)
        found.queue.clear()
        arrange(arguments, feeding.TorchSharing(runtime, found.queue))
        found.pending_broadcast = True
        if name == "fit":
            from keras_mgpu_plugins.backends.torch import parallel

            parallel.average_gradients_of(self)  # compiled again since? a new optimizer
            found.buffers = None  # found again at the first step (a layer frozen since?)
            found.step_logs = runtime.agree(_step_logs_read(self, arguments))
        return original(self, **arguments, **extra)

    return method


def _step_logs_read(model: Any, arguments: dict) -> bool:
    """Whether this fit's per-step logs are read (a progress bar, a callback's batch hook, a
    train_step of the user's whose logs Keras may keep): then every step reduces them;
    else only the epoch's logs are (`steps.global_logs`)."""
    import keras

    hooks = ("on_train_batch_end", "on_batch_end")
    callbacks = arguments.get("callbacks") or []
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks  # one given already wrapped: its members decide
    batch_hooks = any(getattr(type(c), h, None) is not getattr(keras.callbacks.Callback, h)
                      for c in callbacks for h in hooks)
    own_step = not getattr(type(model).train_step, "__module__", "").startswith("keras.")
    return bool(arguments.get("verbose")) or batch_hooks or own_step


def _keras_signature(name: str) -> inspect.Signature:
    """The signature of Keras's own `Model.<name>` (the trainer class that defines it)."""
    import keras

    for owner in keras.Model.__mro__[1:]:
        if name in vars(owner):
            return inspect.signature(vars(owner)[name])
    raise AttributeError(f"keras.Model has no {name}")
