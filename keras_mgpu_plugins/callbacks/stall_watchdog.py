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

import contextlib
import functools
import inspect
import math
import os
import sys
import threading
import time
from types import CodeType
from typing import Any

import keras

from keras_mgpu_plugins import _progress, compat, runtime
from keras_mgpu_plugins._progress import note_progress, paused  # noqa: F401 (public here)
from keras_mgpu_plugins.callbacks import _stall

#: Exit code of a worker that the watchdog stops (sysexits' EX_SOFTWARE).
STALL_EXIT_CODE = 70
#: Environment variable naming a folder shared by every worker of a job.
JOB_DIR_ENV = "KMP_JOB_DIR"
#: This process's progress (`keras_mgpu_plugins._progress`).
_clock = _progress.clock


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
    writes pause the clock; evaluation batches count as progress. `kmp-launch --stall-timeout SECONDS` adds one to every `fit`.

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
        self._check_every_worker_has_one()
        note_progress()
        self._start()

    def _directory(self) -> str | None:
        if self.directory is None and os.environ.get(JOB_DIR_ENV):
            return os.path.join(os.environ[JOB_DIR_ENV], "stall_watchdog")
        return self.directory

    def _check_every_worker_has_one(self) -> None:
        """Raises on every worker with a watchdog if a worker has none, then compares settings.

        Out of band first (settings files in the heartbeat folder), because a
        collective that only the workers with a watchdog run would meet the
        other workers' first training step. Without a folder, nothing is compared.
        """
        here, directory = runtime.of(self.model), self._directory()
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
                f"of this worker's train begin (heartbeat folder {directory!r}). Pass "
                "StallWatchdog(...) to fit on every worker (or use `kmp-launch "
                "--stall-timeout SECONDS`, which adds one to every worker's fit).")
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

    def _start(self) -> None:
        self.on_train_end()  # a previous fit's thread, if fit raised before its end
        self._stop = threading.Event()
        directory = self._directory()
        watch = _Watch(self.timeout, self.poll_interval, directory, self._stop,
                       runtime.of(self.model).rank())
        self._thread = threading.Thread(target=watch.run, name="kmp-stall-watchdog",
                                        daemon=True)
        self._thread.start()


_ALONE = runtime.Rank(0, 1, True)


class _Watch:
    """The watchdog thread's loop, for the fit that started it."""

    def __init__(self, timeout: float, interval: float, directory: str | None,
                 stop: threading.Event, rank: runtime.Rank = _ALONE) -> None:
        self.timeout, self.interval, self.stop = timeout, interval, stop
        self.worker, self.num_workers = rank.worker_index, rank.num_workers
        self.board = _stall.Board(directory, self.worker)
        self.training_thread = threading.get_ident()
        self.fit_code = _fit_code(sys._getframe())
        self.started = time.time()
        # The `tf.function` call seen tracing, and when its tracing was last seen.
        self.traced_call: Any = None
        self.traced_at = 0.0

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            frame = sys._current_frames().get(self.training_thread)
            if frame is None or not _on_stack(self.fit_code, frame):
                break  # fit ended without on_train_end (it raised): nothing to watch
            self.board.publish(self._report(frame))
            message = self.board.stall()
            if message is None:
                verdict = _stall.decide(
                    self.board.read(self.num_workers, since=self.started - 5.0),
                    self.num_workers, self.timeout, time.time(), time.time() - self.started)
                if verdict is None:
                    continue
                message = self.board.claim(verdict.message)
            self._fail(message)
        self.board.publish(_stall.Report(self.worker, 0.0, time.time(), _clock.count,
                                         "finished", False, "finished"))

    def _report(self, frame: Any) -> _stall.Report:
        busy, inside_tf, where = _stall.locate(frame)
        first_run = self._first_run(frame, busy)  # called on every look: it sees tracing too
        busy = busy or first_run or ", ".join(_clock.paused)
        if busy:
            _clock.touch()
            where = f"{where} ({busy})"
        return _stall.Report(self.worker, time.monotonic() - _clock.last, time.time(),
                             _clock.count, "busy" if busy else "running", inside_tf, where)

    def _first_run(self, frame: Any, busy: str) -> str:
        """Busy while the call that traced a function runs it, up to `timeout` after tracing.

        Its first run also builds and optimizes the graph and, on several workers, sets up
        the collectives with every peer: often longer than a step. Bounded, because a peer
        stuck before its first step leaves this call waiting for good.
        """
        if busy == "tracing a function":
            self.traced_call, self.traced_at = _stall.outermost_call(frame), time.monotonic()
            return ""
        if self.traced_call is None:
            return ""
        if (time.monotonic() - self.traced_at < self.timeout
                and _stall.has_frame(frame, self.traced_call)):
            return "first run of a function just traced"
        self.traced_call = None  # returned, or ran longer than timeout: a step like any other
        return ""

    def _fail(self, message: str) -> None:
        prefix = "" if os.environ.get("KMP_LAUNCH_WORKER") else f"[worker {self.worker}] "
        text = (f"{message}\nStallWatchdog: Python stacks of worker {self.worker} "
                f"of {self.num_workers} (all threads):\n{_stall.format_stacks()}")
        with contextlib.suppress(Exception):
            sys.stderr.write("".join(f"{prefix}{line}\n" for line in text.splitlines()))
            sys.stderr.flush()
            sys.stdout.flush()
        # The first worker to exit makes kmp-launch stop the others: first let each print
        # (it sees the stall at its next look, then formats its stacks: slow on a busy machine).
        self.board.dumped(self.num_workers, wait_s=max(30.0, 3 * self.interval))
        os._exit(STALL_EXIT_CODE)


def _fit_code(frame: Any) -> CodeType | None:
    """The code of the `fit` call that is running on this thread, if one is."""
    while frame is not None:
        if frame.f_code.co_name == "fit":
            return frame.f_code
        frame = frame.f_back
    return None


def _on_stack(code: CodeType | None, frame: Any) -> bool:
    if code is None:
        return True
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


#: The timeout `add_to_every_fit` set last (read by the wrapper at each `fit`).
_EVERY_FIT: dict[str, float] = {}


def add_to_every_fit(timeout: float) -> None:
    """Makes every `keras.Model.fit` in this process run with `StallWatchdog(timeout)`.

    Used by `kmp-launch --stall-timeout`; a `fit` given a watchdog of its own keeps it.
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
