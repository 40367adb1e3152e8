"""Only the chief shows Keras progress bars: `fit`/`evaluate`/`predict` run with `verbose=0`
on the other workers of a multi-worker job, unless `KMP_OUTPUT=all`.

Every worker of a multi-worker job runs the same `fit`, so each prints the same
progress bar (the logs are the global ones, the same on every worker): N
copies interleaved in the terminal of `kmp-launch`, or in SLURM's output file.
Horovod's advice is to pass `verbose=1 if rank == 0 else 0`; `install()` does
it for every `fit`, `evaluate` and `predict` run under a job of several
workers (who is chief comes from `kmp.runtime`, the one source). Only the
progress bar goes: callbacks, `History` and the returned values are unchanged
(Keras's `verbose` only decides whether its `ProgbarLogger` is added).
`KMP_OUTPUT=all` in the workers' environment (what `kmp-launch --all-output`
and `kmp.launch(output="all")` set) keeps each call's own `verbose`.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

_MARK = "_kmp_chief_progress"
ENV_VAR = "KMP_OUTPUT"


def quiet_here() -> bool:
    """Whether this process's Keras progress bars are off: a non-chief worker, `KMP_OUTPUT` unset.

    Raises:
        ValueError: If `KMP_OUTPUT` is set to something other than "chief" or "all".
    """
    setting = os.environ.get(ENV_VAR, "chief")
    if setting not in ("chief", "all"):
        raise ValueError(f'{ENV_VAR} must be "chief" (progress bars on the chief only, the '
                         f'default) or "all" (every worker\'s). Received: {ENV_VAR}={setting!r}')
    if setting == "all":
        return False
    from keras_mgpu_plugins import runtime

    here = runtime.of().rank()
    return here.num_workers > 1 and not here.is_chief


def install() -> None:
    """Makes `keras.Model.fit`, `evaluate` and `predict` use `verbose=0` where `quiet_here()`.

    Idempotent: applies the registered patch `chief_only_progress_bars`
    (`kmp.compat.PATCHES`; `unpatch_keras()` undoes it). Read at each call, so a
    process that is not (yet) part of a multi-worker job is unaffected.
    """
    from keras_mgpu_plugins.compat import _registry

    _registry.apply("chief_only_progress_bars")


def wrap_model_methods() -> Callable[[], None]:
    """The patch itself: wraps the three methods; returns the undo."""
    import keras

    from keras_mgpu_plugins.compat._record import replace

    undo = [replace(keras.Model, name, _quiet_on_other_workers(getattr(keras.Model, name)))
            for name in ("fit", "evaluate", "predict")]
    return lambda: [each() for each in reversed(undo)]


def _quiet_on_other_workers(original: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not quiet_here():
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["verbose"] = 0
        return original(*bound.args, **bound.kwargs)

    setattr(method, _MARK, True)
    return method
