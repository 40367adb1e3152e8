"""One worker process as the launcher sees it: `_Worker`.

Its output is relayed line by line with a `[worker i] ` prefix (the last lines
of its stderr are kept for the failure message); its outcome is read from the
files `launch._worker` writes; its process group, and descendants that left
it, can be signalled. `launch._supervisor` starts and supervises the workers.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import Any

from keras_mgpu_plugins.launch import _worker
from keras_mgpu_plugins.launch._errors import LaunchError

#: Exit code of a worker stopped by `StallWatchdog` (its module imports Keras: not here).
STALL_EXIT_CODE = 70
_TAIL_LINES = 20
_output_lock = threading.Lock()


class _Worker:
    """One worker process: its pipes' relays, outcome files and process group."""

    def __init__(self, index: int, proc: subprocess.Popen, spec_path: str,
                 job_dir: str) -> None:
        self.index, self.proc = index, proc
        self.stall_path = os.path.join(job_dir, "stall_watchdog", "stall.txt")
        self.result_path = _worker.outcome_path(spec_path, index, "result")
        self.error_path = _worker.outcome_path(spec_path, index, "error")
        self.exited_at: float | None = None  # wall time it was seen to exit on its own
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.relays = [
            threading.Thread(target=_relay, args=(pipe, index, name, tail), daemon=True)
            for pipe, name, tail in ((proc.stdout, "stdout", None),
                                     (proc.stderr, "stderr", self.stderr_tail))
        ]
        for relay in self.relays:
            relay.start()

    def check_exit(self) -> bool:
        if self.exited_at is None and self.proc.poll() is not None:
            self.exited_at = time.time()
        return self.exited_at is not None

    def failed(self, expects_result: bool) -> bool:
        """Failed on its own (not merely stopped by the launcher)."""
        if os.path.exists(self.error_path):
            return True
        if self.exited_at is None:
            return False
        return not os.path.exists(self.result_path) if expects_result else self.proc.returncode != 0

    def error_record(self) -> tuple[str | None, BaseException | None, float | None, str | None]:
        """The worker's report: exception type name, exception, wall time, traceback text."""
        record = _worker.read_error(self.error_path)
        if record is None and self.proc.returncode == STALL_EXIT_CODE:
            with contextlib.suppress(OSError), open(self.stall_path) as f:
                return "StallError", None, self.exited_at, f.read()
        return record if record is not None else (None, None, self.exited_at, None)

    def result(self) -> Any:
        """The value `fn` returned in this worker."""
        try:
            with open(self.result_path, "rb") as f:
                return pickle.load(f)
        except Exception as err:
            raise LaunchError(f"The value worker {self.index} returned cannot be unpickled in "
                              f"the parent: {type(err).__name__}: {err}") from err

    def group_alive(self) -> bool:
        """Whether a live (non-zombie) process remains in the worker's process group."""
        import psutil

        self.proc.poll()
        try:
            os.killpg(self.proc.pid, 0)
        except OSError:
            return False
        for pid in psutil.pids():  # zombies wait for a reaper we do not control
            try:
                if (os.getpgid(pid) == self.proc.pid
                        and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE):
                    return True
            except (OSError, psutil.Error):
                pass
        return False

    def kill_tree(self, sig: int) -> None:
        """Signals the worker's process group, and its descendants that left it."""
        import psutil

        children = []
        if self.proc.poll() is None:  # not reaped: its pid is still this worker's
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(self.proc.pid).children(recursive=True)
        for target in children:
            try:
                target.send_signal(sig)
            except psutil.Error:
                pass
        try:
            os.killpg(self.proc.pid, sig)
        except OSError:
            pass


def _relay(pipe: Any, index: int, stream_name: str, tail: collections.deque | None) -> None:
    prefix = f"[worker {index}] "
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            if tail is not None:
                tail.append(line)
            with _output_lock:
                try:
                    stream = getattr(sys, stream_name)
                    stream.write(f"{prefix}{line}\n")
                    stream.flush()
                except (AttributeError, OSError, ValueError):
                    pass  # no usable stream: the line is dropped, the worker goes on
