"""Log files a `fit` resumed by `kmp.callbacks.BackupAndRestore` appends to, each epoch once.

A resumed `fit` goes on at the backup's epoch (and batch). A log file must keep what the
stopped run wrote before that point and lose what it wrote after it (up to one backup
interval: the epochs a killed run logged after its last backup), so that it holds every
epoch once, as the uninterrupted run's would:

- Keras's `CSVLogger` (`append=False` overwrites its file at each `fit`): in a `fit` whose
  `BackupAndRestore` resumes a backup, it keeps its file's rows up to that epoch and
  appends (the patch `csv_logger_resumes`, on `CSVLogger.on_train_begin`); a `fit` that
  restores nothing is left to Keras. Whatever the order of the two callbacks: a
  `CSVLogger` listed first opens its file once the backup is read.
- `kmp.callbacks.DeviceMetricsLogger(csv_path=...)` asks `point` when it opens its file.

Each `BackupAndRestore` announces itself when Keras's `CallbackList` sets its model
(`announce`: before any callback's `on_train_begin`), and says where the `fit` resumes
once it has restored (`Resume.known`). A writer finds the one of its own `fit` by the
`params` dict Keras's `CallbackList` gives every callback of one `fit`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.io import csv_rows

#: Where a fit resumes: (epoch, batches of it already trained), or `None` (from scratch).
Point = tuple[int, int] | None
_UNKNOWN = object()
_RESUMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> Resume


class Resume:
    """Where the `fit` a `BackupAndRestore` was given to resumes, once it has restored."""

    def __init__(self, callback: Any) -> None:
        self._callback = weakref.ref(callback)
        self._point: Any = _UNKNOWN
        self._waiting: list[Callable[[Point], None]] = []

    def of_fit(self, params: Any) -> bool:
        """Whether its callback is one of the `fit` whose callbacks were given `params`."""
        callback = self._callback()
        return callback is not None and params is not None and callback.params is params

    def known(self, point: Point) -> None:
        self._point = point
        waiting, self._waiting = self._waiting, []
        for call in waiting:
            call(point)

    def when_known(self, call: Callable[[Point], None]) -> None:
        if self._point is _UNKNOWN:
            self._waiting.append(call)
        else:
            call(self._point)

    @property
    def point(self) -> Point:
        return None if self._point is _UNKNOWN else self._point


def announce(model: Any, callback: Any) -> Resume:
    """`callback` (a `BackupAndRestore`) is given to the `fit` of `model` being set up."""
    _RESUMES[model] = resume = Resume(callback)
    return resume


def of(model: Any, params: Any) -> Resume | None:
    """The `Resume` of the `fit` whose callbacks have `params`, if a `BackupAndRestore` is one."""
    try:
        resume = _RESUMES.get(model)
    except TypeError:  # not weakly referenceable
        return None
    return resume if resume is not None and resume.of_fit(params) else None


def point(model: Any, params: Any) -> Point:
    """Where the `fit` whose callbacks have `params` resumed (`None`: from scratch, or no
    `BackupAndRestore`, or not restored yet)."""
    resume = of(model, params)
    return None if resume is None else resume.point


def asker(callback: Any) -> Callable[[], Point]:
    """Asks, when called, where the `fit` of `callback` (one of its callbacks) resumed: a log
    file it opens then keeps the rows before that point and appends."""
    return lambda: point(callback.model, callback.params)


def wrap_csv_logger() -> Callable[[], None]:
    """The patch `csv_logger_resumes` (see the module docstring); returns the undo."""
    import keras

    from keras_mgpu_plugins.compat._record import replace

    original = keras.callbacks.CSVLogger.on_train_begin

    def on_train_begin(self: Any, logs: dict | None = None) -> None:
        resume = of(self.model, self.params)
        if resume is None:
            return original(self, logs)
        resume.when_known(lambda at: _open(self, original, logs, at))
        return None

    return replace(keras.callbacks.CSVLogger, "on_train_begin", on_train_begin)


def _open(logger: Any, original: Callable, logs: dict | None, at: Point) -> None:
    """Keras's `on_train_begin`; resumed at `at`, on the file's rows before it, appending."""
    if at is None:
        return original(logger, logs)
    csv_rows.keep_rows(logger.filename, logger.sep,
                       lambda rows: csv_rows.last_run_from(rows, at[0]))
    append, logger.append = logger.append, True
    try:
        return original(logger, logs)
    finally:
        logger.append = append
