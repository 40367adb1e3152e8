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

The same all-gather compares each worker's number of steps per epoch (Keras's
`params["steps"]`): arrays of different lengths on different workers give them
different step counts, and the worker with more steps would wait forever in
its extra steps' all-reduce. Every worker raises `SettingsDifferError`, naming
each worker's count.

Keras's own file writers are handled here too (`_keras_writers`): `CSVLogger`
and `TensorBoard` run on the chief only; `ModelCheckpoint` and
`BackupAndRestore` (Keras's, not kmp's) make every worker raise at train begin.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from typing import Any

import numpy as np

from keras_mgpu_plugins import _keras_writers

_MARK = "_kmp_same_callbacks"


def kmp_callback_names(callbacks: Any) -> tuple[str, ...]:
    """The kmp callbacks among `callbacks`, as sorted class names (repeated once per instance)."""
    counts = Counter(type(c).__name__ for c in callbacks
                     if type(c).__module__.startswith("keras_mgpu_plugins."))
    return tuple(sorted(counts.elements()))


def _steps_differ_error(all_steps: list[int], here: int) -> Exception:
    from keras_mgpu_plugins.runtime import SettingsDifferError

    counts = ", ".join(f"worker {i}: {'unknown' if n < 0 else n}" for i, n in enumerate(all_steps))
    return SettingsDifferError(
        f"model.fit would run a different number of steps per epoch on different workers "
        f"({counts}; this is worker {here}). Each step all-reduces the gradients across "
        "workers, so the worker with more steps would wait forever for the others. Give "
        "every worker inputs of the same length (or the same number of batches), or pass "
        "the same steps_per_epoch=... on every worker (at most the smallest count), or feed "
        "one tf.data.Dataset that TensorFlow shards across the workers."
    )


def check(callbacks: Any, runtime: Any, steps: int | None = None) -> None:
    """Raises on every worker if their kmp callbacks, or their steps per epoch, differ.

    One `runtime.settings_differ` (an all-gather of a CRC-32 of the callbacks' names
    and one of the step count), on every worker, when `runtime` (`kmp.runtime.of(model)`)
    spans workers; a second all-gather of the step counts when they differ, to name them.

    The same all-gather carries which of Keras's own checkpoint callbacks each worker
    was given (`_keras_writers.refused`): if any worker was given one, every worker
    raises, the ones without it after a second all-gather naming the workers with it.

    Raises:
        SettingsDifferError: If the workers' step counts differ (`None`, unknown,
            counts as its own value), naming each worker's count; or if their kmp
            callbacks differ, naming them.
        ValueError: If any worker was given `keras.callbacks.ModelCheckpoint` or
            `keras.callbacks.BackupAndRestore` (not kmp's drop-ins), naming them.
    """
    from keras_mgpu_plugins.runtime import SettingsDifferError

    if not runtime.spans_workers:
        return
    names = kmp_callback_names(callbacks)
    writers = _keras_writers.refused(callbacks)
    here = runtime.worker_index
    count = -1 if steps is None else int(steps)
    differ_from_chief = runtime.settings_differ(
        {"kmp_callbacks": names, "steps": count, "keras_writers": writers})
    if "steps" in differ_from_chief:  # every worker knows: every worker gathers the counts
        all_steps = [int(n) for n in runtime.all_gather(np.array([count], np.int64))[:, 0]]
        raise _steps_differ_error(all_steps, here)
    if "keras_writers" in differ_from_chief:  # every worker knows: every worker gathers who
        given = runtime.all_gather(np.array([bool(writers)]))[:, 0]
        raise _keras_writers.refusal(writers, here, [int(r) for r in np.flatnonzero(given)])
    if writers:  # the same on every worker: each raises, with no further collective
        raise _keras_writers.refusal(writers, here, list(range(runtime.num_workers)))
    differ = [int(r) for r in differ_from_chief.get("kmp_callbacks", ())]
    if differ:
        raise SettingsDifferError(
            f"model.fit was given different kmp callbacks on different workers: here "
            f"(worker {here}) {list(names)}. kmp's callbacks run "
            "collective operations with the other workers, so a worker given one the others "
            "were not would leave them waiting: pass the same callbacks, with the same "
            "arguments, on every worker (kmp's ModelCheckpoint, BackupAndRestore and "
            "WeightSyncVerifier already write on the chief only). kmp_callbacks (here "
            f"{names!r}; differs from the chief's on worker(s) "
            f"{', '.join(str(r) for r in differ)})."
        )


def install() -> None:
    """Makes every `keras.Model.fit` under a multi-worker strategy call `check` first. Idempotent.

    The check runs as the first callback's `on_train_begin`, before any other
    callback's collective and any training step. Keras's `CSVLogger` and
    `TensorBoard` are given to the chief's `fit` only. A `fit` given callbacks, of a
    model that would train apart on each of the job's processes, is refused before it
    starts (`runtime.apart`); any other `fit` outside a multi-worker strategy is
    unchanged. Applies the registered patch `same_callbacks_on_every_worker`
    (`kmp.compat.PATCHES`).
    """
    from keras_mgpu_plugins.compat import _registry

    _registry.apply("same_callbacks_on_every_worker")


def wrap_fit() -> Any:
    """The patch itself: wraps `keras.Model.fit`; returns the undo."""
    import keras

    from keras_mgpu_plugins.compat._record import replace

    original = keras.Model.fit
    signature = inspect.signature(original)

    class SameCallbacks(keras.callbacks.Callback):
        def __init__(self, given: list) -> None:
            super().__init__()
            self.given = given

        def on_train_begin(self, logs: Any = None) -> None:
            from keras_mgpu_plugins import runtime

            check(self.given, runtime.of(self.model), self.params.get("steps"))

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        from keras_mgpu_plugins import runtime
        from keras_mgpu_plugins.runtime import apart

        here = runtime.of(self, refuse_apart=False)
        bound = signature.bind(self, *args, **kwargs)
        given = apart.given_callbacks(bound.arguments.get("callbacks"))
        if not here.spans_workers:
            if given:
                apart.check(self, here)  # callbacks would act for a job of separate models
            _keras_writers.check_installed(given)
            return original(self, *args, **kwargs)
        _keras_writers.check_installed(given)  # on every worker alike: before any collective
        kept = _keras_writers.for_this_worker(given, here.is_chief)
        bound.arguments["callbacks"] = [SameCallbacks(given), *kept]
        return original(*bound.args, **bound.kwargs)

    setattr(fit, _MARK, True)
    return replace(keras.Model, "fit", fit)
