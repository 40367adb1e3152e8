"""`StallWatchdog`: turns a hang in a multi-worker job into an error with stacks.

Progress is what the training thread reports: batch and epoch ends, evaluation
begin and end (the hooks below), and `note_progress()`, which any module may
call (`kmp.collective` does, on entering and leaving a collective). TensorFlow
tracing a function, then the first run of what it traced (up to `timeout`), and
a save in progress (seen on the training thread's stack) pause the clock, and so
does code inside `paused(what)`.

The workers that are not stuck are usually blocked in a collective, waiting for
the stuck one, so they cannot ask it anything over TensorFlow. Each worker's
watchdog thread therefore publishes a heartbeat out of band, a small JSON file
(its idle time, progress count, and where its training thread is) in a folder
every worker reads: `directory`, or the job folder `kmp-launch` gives its
workers (`KMP_JOB_DIR`). A file, not a socket to the chief, because the chief may
be the stuck one, and a folder needs no ports, no server thread and no retry
logic. Without a folder each worker judges only itself.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import threading
from typing import Any

import keras

from keras_mgpu_plugins import compat, runtime
from keras_mgpu_plugins._progress import note_progress, paused  # noqa: F401 (public here)
from keras_mgpu_plugins.callbacks import _stall
from keras_mgpu_plugins.callbacks._stall_watch import _ALONE, STALL_EXIT_CODE, _Watch  # noqa: F401

#: Environment variable naming a folder shared by every worker of a job.
JOB_DIR_ENV = "KMP_JOB_DIR"


class StallWatchdog(keras.callbacks.Callback):
    """Fails the job, with every worker's Python stacks, when training stops progressing.

    A thread on each worker watches progress: batches, epoch ends, evaluations,
    `kmp.collective` calls entered and left.
    When no worker has progressed for `timeout` seconds, every worker prints an
    explanation naming the stuck worker and where it is stuck (workers inside a
    TensorFlow op are taken as waiting for it in a collective), then the Python
    stacks of all its threads, and exits with code `STALL_EXIT_CODE` (70): under
    `kmp-launch` the launcher then stops the job and reports the stall; under
    another scheduler the non-zero exit marks the job failed. Tracing a
    `tf.function` (then its first run, up to `timeout` more) and checkpoint
    writes pause the clock; evaluation batches count as progress. `kmp-launch` and
    `kmp.launch` add one to every `fit` (`--stall-timeout SECONDS` / `stall_timeout=`;
    600 s by default). A `fit` that runs no collective with other workers (its model
    is under no strategy that spans them) is watched alone: its own progress only,
    nothing compared or shared with the other workers.

    Args:
        timeout: Seconds without progress on any worker before the job fails.
            Choose it above your slowest step (and evaluation batch).
        directory: A folder every worker can read and write, for the
            heartbeats (a shared file system across hosts). Default: the job
            folder of `kmp-launch` (`KMP_JOB_DIR`); without one each worker
            judges only its own progress.

    Raises:
        ValueError: For a `timeout` that is not a positive number of seconds.
        TypeError: For a `directory` that is not a string.
        SettingsDifferError: At train begin, on every worker with a watchdog,
            if a worker has none (its settings file does not come within
            `timeout` seconds), or if `timeout` differs between
            workers. Both checks need the heartbeat folder; without one
            nothing is compared across workers.

    Example:
        >>> import keras_mgpu_plugins as kmp
        >>> watchdog = kmp.callbacks.StallWatchdog(timeout=600)
        >>> # model.fit(x, y, callbacks=[watchdog])
    """

    #: Fits with a watchdog this process began: matches settings files of the same fit.
    _fits = 0

    def __init__(self, timeout: float = 600, directory: str | None = None) -> None:
        super().__init__()
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not math.isfinite(timeout) or timeout <= 0):
            raise ValueError("timeout must be a positive number of seconds. "
                             f"Received: timeout={timeout!r}")
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path or None. Received: directory={directory!r}")
        self.timeout = float(timeout)
        self.directory = None if directory is None else os.fspath(directory)
        self.poll_interval = min(1.0, self.timeout / 10)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        compat.set_async_safe(self, True)  # the batch hooks only assign two numbers

    def on_train_begin(self, logs: dict | None = None) -> None:
        # (the launcher adds one to every fit: a model trained on one process alone included)
        here = runtime.of(self.model, refuse_apart=False)
        spans = here.spans_workers  # else: no peer can hold this fit up; watched alone
        if spans:
            self._check_every_worker_has_one(here)
        note_progress()
        self._start(here.rank() if spans else _ALONE, self._directory(shared=spans))

    def _directory(self, shared: bool = True) -> str | None:
        """The heartbeat folder: `directory`, else (`shared`) the launcher's job folder."""
        if self.directory is None and shared and os.environ.get(JOB_DIR_ENV):
            return os.path.join(os.environ[JOB_DIR_ENV], "stall_watchdog")
        return self.directory

    def _check_every_worker_has_one(self, here: runtime.Runtime) -> None:
        """Raises on every worker with a watchdog if a worker has none, then compares settings.

        Out of band first (settings files in the heartbeat folder), because a
        collective that only the workers with a watchdog run would meet the
        other workers' first training step. Without a folder, nothing is compared.
        """
        directory = self._directory()
        num_workers = here.num_workers
        if num_workers == 1 or directory is None:
            return
        StallWatchdog._fits += 1
        os.makedirs(directory, exist_ok=True)
        # Up to `timeout`, not less: a worker that reaches fit later (slow data loading)
        # is not yet a stall, and must not be taken for one without a watchdog.
        wait_s = self.timeout
        missing = _stall.meet(directory, here.worker_index, num_workers,
                              StallWatchdog._fits, {"timeout": self.timeout}, wait_s)
        if missing:
            raise runtime.SettingsDifferError(
                "StallWatchdog must run on every worker, or on none: worker(s) "
                f"{', '.join(map(str, missing))} started no StallWatchdog within {wait_s:g} s "
                f"of this worker's train begin (heartbeat folder {directory!r}): it has none, "
                "or it has not reached fit (stuck before training, or slower than timeout to "
                "get there). Pass StallWatchdog(...) to fit on every worker (kmp-launch and "
                "kmp.launch add one to every worker's fit).")
        # Every worker has one: each runs this collective, so it cannot meet a training step.
        here.same_settings({"timeout": self.timeout}, type(self).__name__)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        note_progress()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        note_progress()

    def on_test_begin(self, logs: dict | None = None) -> None:
        note_progress()

    def on_test_end(self, logs: dict | None = None) -> None:
        note_progress()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        note_progress()

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        note_progress()

    def _start(self, rank: runtime.Rank, directory: str | None) -> None:
        self.on_train_end()  # a previous fit's thread, if fit raised before its end
        self._stop = threading.Event()
        watch = _Watch(self.timeout, self.poll_interval, directory, self._stop, rank)
        self._thread = threading.Thread(target=watch.run, name="kmp-stall-watchdog",
                                        daemon=True)
        self._thread.start()


#: The timeout `add_to_every_fit` set last (read by the wrapper at each `fit`).
_EVERY_FIT: dict[str, float] = {}


def add_to_every_fit(timeout: float) -> None:
    """Makes every `keras.Model.fit` in this process run with `StallWatchdog(timeout)`.

    Used by the launcher's workers (`kmp-launch`, `kmp.launch`, see `run.prepare`); a
    `fit` given a watchdog of its own keeps it.
    Applies the registered patch `stall_watchdog_on_every_fit` (`kmp.compat.PATCHES`);
    called again, the last timeout holds.
    """
    StallWatchdog(timeout)  # checks the value now
    _EVERY_FIT["timeout"] = timeout
    compat.apply("stall_watchdog_on_every_fit")


def wrap_every_fit() -> Any:
    """The patch itself: wraps `keras.Model.fit`; returns the undo."""
    original = keras.Model.fit
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        callbacks = list(bound.arguments.get("callbacks") or [])
        if not any(isinstance(c, StallWatchdog) for c in callbacks):
            bound.arguments["callbacks"] = [*callbacks, StallWatchdog(_EVERY_FIT["timeout"])]
        return original(*bound.args, **bound.kwargs)

    return compat.replace(keras.Model, "fit", fit)
