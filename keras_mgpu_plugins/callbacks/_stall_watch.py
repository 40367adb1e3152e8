"""The watchdog thread of `StallWatchdog`: what it publishes, and how it fails the job.

Each look reads the training thread's stack (`_stall.locate`), publishes this worker's
heartbeat on the board, and asks `_stall.decide` whether any worker stalled; the first
to see a stall claims it, prints every thread's stack and exits the process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from types import CodeType
from typing import Any

from keras_mgpu_plugins import _progress, runtime
from keras_mgpu_plugins.callbacks import _stall

#: Exit code of a worker that the watchdog stops (sysexits' EX_SOFTWARE).
from keras_mgpu_plugins.errors import STALL_EXIT_CODE

_clock = _progress.clock
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
            report = self._report(frame)
            self.board.publish(report)
            message = self.board.stall()
            if message is None:
                verdict = self._verdict(report)
                if verdict is None:
                    continue
                message = self.board.claim(verdict.message)
            self._fail(message)
        self.board.publish(_stall.Report(self.worker, 0.0, time.time(), _clock.count,
                                         "finished", False, "finished"))

    def _verdict(self, report: _stall.Report) -> _stall.Verdict | None:
        if self.board.directory is None and self.num_workers > 1:  # no peer's heartbeat
            return _stall.decide_alone(report, self.worker, self.timeout, time.time())
        return _stall.decide(self.board.read(self.num_workers, since=self.started - 5.0),
                             self.num_workers, self.timeout, time.time(),
                             time.time() - self.started)

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
