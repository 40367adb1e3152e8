"""The private Keras trainer API a mid-epoch resume goes through: `fit`'s epoch iterator.

A `fit` resumed by `kmp.callbacks.BackupAndRestore` starts mid-epoch: the batches the
backup had trained are drawn from the input in the same order (so the next ones are the
uninterrupted run's) and dropped before Keras's loop sees them. Keras's `fit` (3.10 to
3.16.0.dev, TensorFlow, JAX and torch alike) loops

    for begin_step, end_step, iterator in epoch_iterator:      # (step, iterator) before 3.11
        callbacks.on_train_batch_begin(begin_step)
        logs = self.train_function(iterator)                   # or (state, iterator), or (data)
        callbacks.on_train_batch_end(end_step, logs)

over the steps its `EpochIterator._enumerate_iterator` yields, each with the iterator of
the epoch's batches. The per-instance patch `resume_skips_trained_batches` replaces that
generator on the running `fit`'s epoch iterator (its local `epoch_iterator`, made before
`on_train_begin`), for one epoch: the steps before the backup's batch are drawn from the
yielded iterator and not yielded, so no callback hook, train step, progress bar or log sees
them; the first step yielded is the first trained batch, with its real index.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.compat import _names
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require
from keras_mgpu_plugins.errors import UncheckedVersionError

PATCH = "resume_skips_trained_batches"


def fit_epoch_iterator(model: Any) -> Any:
    """The epoch iterator of the `fit` of `model` running on this thread (called from inside
    it, e.g. a callback's `on_train_begin`); `None` outside Keras's own `fit` (kmp's
    parameter-server `fit`, a `fit` of the user's own).

    Raises:
        RuntimeError: If this Keras's `fit` is not known to keep one (`require`).
    """
    require("fit_epoch_iterator")
    iterator_class = resolve("epoch iterator")
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "fit" and "epoch_iterator" in code.co_varnames + code.co_cellvars:
            found = frame.f_locals
            if found.get("self") is model and isinstance(found.get("epoch_iterator"),
                                                         iterator_class):
                return found["epoch_iterator"]
        frame = frame.f_back
    return None


def skip_trained_batches(model: Any, batches: int,
                         then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """Makes the running `fit`'s next epoch start at batch `batches`, the earlier ones drawn
    from its input and seen by nothing (see the module docstring).

    Args:
        model: The model whose `fit` is running (called from its `on_train_begin`).
        batches: How many batches of the epoch to draw and drop (a multiple of the
            model's `steps_per_execution`).
        then: Called once they are drawn, before the first step is trained.

    Returns:
        The undo (idempotent), or `None` where `fit` is not Keras's (nothing was changed).

    Raises:
        RuntimeError: If this Keras's `fit` is not known to loop that way (`require`).
    """
    from keras_mgpu_plugins.compat import _registry

    epoch_iterator = fit_epoch_iterator(model)
    if epoch_iterator is None:
        return None
    if not _registry.apply_to(PATCH, epoch_iterator, int(batches), then):
        raise UncheckedVersionError(
            f"kmp.compat patch {PATCH} was not applied on this Keras: a resumed fit would "
            "train again the batches the backup had trained. Use a Keras version it was "
            "checked for (python -m keras_mgpu_plugins.compat lists them).")
    return lambda: _registry.remove_from(PATCH, epoch_iterator)


def skip_in_next_epoch(epoch_iterator: Any, batches: int,
                       then: Callable[[], None] | None) -> None:
    """The patch `resume_skips_trained_batches` (applied by `skip_trained_batches`)."""
    from keras_mgpu_plugins.compat import _registry

    original = epoch_iterator._enumerate_iterator
    per_step = int(getattr(epoch_iterator, "steps_per_execution", 1) or 1)

    def _enumerate_iterator() -> Any:
        _registry.remove_from(PATCH, epoch_iterator)  # this epoch only
        waiting = then
        for step in original():
            begin, iterator = step[0], step[-1]
            count = step[1] - begin + 1 if len(step) == 3 else per_step
            if begin < batches:
                for _ in range(count):
                    next(iterator)
                continue
            if waiting is not None:
                waiting, call = None, waiting
                call()
            yield step

    epoch_iterator._enumerate_iterator = _enumerate_iterator


def present() -> bool:
    """Whether Keras's epoch iterator still enumerates its steps with `_enumerate_iterator`
    (called by `__iter__`), a generator."""
    iterator_class = resolve("epoch iterator")
    return (inspect.isgeneratorfunction(iterator_class._enumerate_iterator)
            and bool(source_has(iterator_class.__iter__, "self._enumerate_iterator()")))


def check_fit_epoch_iterator() -> list[str]:
    """The check of the private use `fit_epoch_iterator`: the active backend's `fit` makes its
    local `epoch_iterator` before `on_train_begin`, then loops over it; Keras's
    `EpochIterator` enumerates its steps with `_enumerate_iterator`."""
    import keras

    backend = keras.backend.backend()
    fit = _trainer_fit(backend)
    if fit is None:
        return [f"the {backend} backend's trainer fit is not known"]
    code = fit.__code__
    problems = [] if "epoch_iterator" in code.co_varnames + code.co_cellvars else [
        f"the {backend} trainer's fit has no local epoch_iterator"]
    try:
        source = inspect.getsource(fit)
    except (OSError, TypeError):
        return [f"the source of the {backend} trainer's fit cannot be read"]
    made, begun, looped = (source.find(text) for text in
                           ("epoch_iterator = ", "on_train_begin(", "in epoch_iterator:"))
    if not 0 <= made < begun < looped:
        problems.append("fit no longer makes epoch_iterator before on_train_begin and then "
                        "loops over it")
    problems += _names.missing("epoch iterator")
    if not problems and not present():
        problems.append("EpochIterator.__iter__ no longer enumerates the generator "
                        "_enumerate_iterator")
    return problems


def _trainer_fit(backend: str) -> Any:
    """`fit` of the trainer class of Keras's `backend` (unwrapped), or `None` if not found."""
    found = {"tensorflow": lambda: _names.find("tensorflow trainer module"),
             "jax": lambda: _names.find("jax trainer module"),
             "torch": lambda: _names.find("torch trainer module")}.get(backend, lambda: None)()
    if found is None:
        return None
    module = found[1]
    fit = next((c.fit for c in vars(module).values() if inspect.isclass(c)
                and c.__module__ == module.__name__ and "fit" in vars(c)), None)
    return None if fit is None else inspect.unwrap(fit)
