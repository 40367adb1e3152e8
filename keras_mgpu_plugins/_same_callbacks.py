"""Every worker's `fit` must be given the same kmp callbacks; a difference raises on every worker.

kmp's callbacks run collective operations with the other workers (settings
checks, agreed stops, chief-only saves). A worker given a callback that the
others were not given (`callbacks=[ModelCheckpoint(...)] if chief else []`,
the tf.keras idiom; a `StallWatchdog` on one worker) runs a collective the
others never run: it meets their first training step and the job hangs, or
fails with an unclear TensorFlow error. `install()` makes every
`keras.Model.fit` under a strategy that spans workers first compare, in one
all-gather, which kmp callbacks each worker was given, so that the job fails
at train begin, on every worker, naming them.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from typing import Any

_MARK = "_kmp_same_callbacks"


def kmp_callback_names(callbacks: Any) -> tuple[str, ...]:
    """The kmp callbacks among `callbacks`, as sorted class names (repeated once per instance)."""
    counts = Counter(type(c).__name__ for c in callbacks
                     if type(c).__module__.startswith("keras_mgpu_plugins."))
    return tuple(sorted(counts.elements()))


def check(callbacks: Any, strategy: Any) -> None:
    """Raises `SettingsDifferError` on every worker if their kmp callbacks differ.

    One all-gather of one CRC-32, on every worker, when `strategy` spans workers.
    """
    from keras_mgpu_plugins import collective

    names = kmp_callback_names(callbacks)
    try:
        collective.same_settings({"kmp_callbacks": names}, "fit's kmp callbacks", strategy)
    except collective.SettingsDifferError as err:
        raise collective.SettingsDifferError(
            f"model.fit was given different kmp callbacks on different workers: here "
            f"(worker {collective.worker_index(strategy)}) {list(names)}. kmp's callbacks run "
            "collective operations with the other workers, so a worker given one the others "
            "were not would leave them waiting: pass the same callbacks, with the same "
            "arguments, on every worker (kmp's ModelCheckpoint, BackupAndRestore and "
            "WeightSyncVerifier already write on the chief only). " + str(err).split(
                " Differing: ", 1)[-1]
        ) from None


def install() -> None:
    """Makes every `keras.Model.fit` under a multi-worker strategy call `check` first. Idempotent.

    The check runs as the first callback's `on_train_begin`, before any other
    callback's collective and any training step. `fit` outside a multi-worker
    strategy is unchanged.
    """
    import keras

    if getattr(keras.Model.fit, _MARK, False):
        return
    original = keras.Model.fit
    signature = inspect.signature(original)

    class SameCallbacks(keras.callbacks.Callback):
        def __init__(self, given: list) -> None:
            super().__init__()
            self.given = given

        def on_train_begin(self, logs: Any = None) -> None:
            check(self.given, self.model.distribute_strategy)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        from keras_mgpu_plugins import collective

        if not collective.spans_workers(self.distribute_strategy):
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        given = list(bound.arguments.get("callbacks") or [])
        bound.arguments["callbacks"] = [SameCallbacks(given), *given]
        return original(*bound.args, **bound.kwargs)

    setattr(fit, _MARK, True)
    keras.Model.fit = fit
