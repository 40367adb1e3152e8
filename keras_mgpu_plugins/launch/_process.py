"""One worker process as the launcher sees it: `_Worker`; where the workers' logs go.

Its output is written line by line to its log file and, when the launcher shows
it (the chief's by default, every worker's with `output="all"`), relayed to the
launcher's own stdout/stderr with a `[worker i] ` prefix (the last lines of its
stderr, and of its whole output, are kept for the failure message); its outcome is read from the
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
import tempfile
import threading
import time
from typing import Any

from keras_mgpu_plugins.errors import STALL_EXIT_CODE
from keras_mgpu_plugins.launch import _worker
from keras_mgpu_plugins.launch._errors import LaunchError
from keras_mgpu_plugins.launch._quiet import RuntimeLines

_TAIL_LINES = 20
_output_lock = threading.Lock()


def output_paths(log_dir: str | None, job_id: str) -> str:
    """Creates and returns the folder of the workers' log files, `worker-<i>.log`.

    By default `<tempdir>/kmp-launch-logs/<job id>` (`tempfile.gettempdir()`,
    the job id of `KMP_JOB_ID`), with `-2`, `-3`... when a run of the same job
    id wrote there already. The files stay after the run.
    """
    if log_dir is not None:
        try:
            os.makedirs(log_dir, exist_ok=True)
        except OSError as err:
            raise LaunchError(f"Cannot create the folder for the workers' log files: {err}. "
                              f"Received: log_dir={log_dir!r}") from err
        return os.path.abspath(log_dir)
    base = os.path.join(tempfile.gettempdir(), "kmp-launch-logs")
    os.makedirs(base, exist_ok=True)
    for attempt in range(1, 1000):
        path = os.path.join(base, job_id if attempt == 1 else f"{job_id}-{attempt}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
            return path
    return tempfile.mkdtemp(prefix=f"{job_id}-", dir=base)


def tell_where_output_goes(spec: dict, num_workers: int, output: str, log_dir: str) -> None:
    if output in ("all", "none") or (num_workers == 1 and not spec.get("num_ps")):
        return
    program = "kmp.launch" if spec["mode"] == "function" else "kmp-launch"
    flag = 'output="all"' if program == "kmp.launch" else "--all-output"
    verbose = 'output="verbose"' if program == "kmp.launch" else "--verbose"
    runtime = (f"; the runtimes' own log lines go to the log files only ({verbose} shows them)"
               if output == "chief" else "")
    if spec.get("num_ps"):
        print(f"{program}: showing the chief's output; the workers and parameter servers write "
              f"to {os.path.join(log_dir, 'worker-<i>.log')} and "
              f"{os.path.join(log_dir, 'ps-<i>.log')} ({flag} shows every task's){runtime}",
              file=sys.stderr, flush=True)
        return
    others = "worker 1 writes" if num_workers == 2 else f"workers 1-{num_workers - 1} write"
    print(f"{program}: showing worker 0's output; {others} to "
          f"{os.path.join(log_dir, 'worker-<i>.log')} ({flag} shows every worker's){runtime}",
          file=sys.stderr, flush=True)


# How long the kernel may take to tear down a killed worker (its memory, then its sockets)
# before it can be seen to have exited.
_TEARDOWN_S = 2.0


class _Worker:
    """One worker process: its pipes' relays, outcome files and process group."""

    def __init__(self, index: int, proc: subprocess.Popen, spec_path: str,
                 job_dir: str, log_path: str, shown: bool = True, label: str | None = None,
                 serves: bool = False, quiet: bool = False) -> None:
        self.index, self.proc = index, proc
        self.log_path, self.shown, self.job_dir = log_path, shown, job_dir
        #: How it is named in messages and before its lines: "worker 1", "chief", "ps 0".
        self.label = label or f"worker {index}"
        #: A worker or parameter server of a parameter-server cluster: it runs TensorFlow's
        #: server until stopped, returns nothing, and any exit of its own is a failure.
        self.serves = serves
        self.stall_path = os.path.join(job_dir, "stall_watchdog", "stall.txt")
        self.result_path = _worker.outcome_path(spec_path, index, "result")
        self.error_path = _worker.outcome_path(spec_path, index, "error")
        self.stopped_path = _worker.outcome_path(spec_path, index, "stopped")
        self.exited_at: float | None = None  # wall time it was seen to exit on its own
        self.stopped_by_launcher = False  # still running when the launcher stopped the job
        self.alive_at: float | None = None  # wall time it was last seen running
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.output_tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.relays = [
            threading.Thread(target=_relay, daemon=True,
                             args=(pipe, self.label, name, tails, log_path, shown, quiet))
            for pipe, name, tails in ((proc.stdout, "stdout", (self.output_tail,)),
                                      (proc.stderr, "stderr", (self.output_tail,
                                                               self.stderr_tail)))
        ]
        for relay in self.relays:
            relay.start()

    def check_exit(self) -> bool:
        if self.exited_at is None:
            now = time.time()
            if self.proc.poll() is None:
                self.alive_at = now
            else:
                self.exited_at = now
        return self.exited_at is not None

    def failed(self, expects_result: bool) -> bool:
        """Failed on its own (not merely stopped by the launcher, nor by a stop signal)."""
        if self.stopped():
            return False
        if os.path.exists(self.error_path):
            return True
        if self.exited_at is None:
            return False
        if self.serves:
            return True
        return not os.path.exists(self.result_path) if expects_result else self.proc.returncode != 0

    def stopped(self) -> bool:
        """Ended by a stop signal (`errors.TrainingStopped`): it said so before exiting."""
        return os.path.exists(self.stopped_path)

    def stopped_record(self) -> dict[str, Any]:
        """What it said: `errors.TrainingStopped.record()` (empty if unreadable)."""
        try:
            with open(self.stopped_path, "rb") as f:
                return dict(pickle.load(f))
        except (OSError, pickle.UnpicklingError, EOFError, TypeError, ValueError):
            return {}

    def error_record(self) -> tuple[str | None, BaseException | None, float | None, str | None]:
        """The worker's report: exception type name, exception, wall time, traceback text."""
        record = _worker.read_error(self.error_path)
        if record is None and self.proc.returncode == STALL_EXIT_CODE:
            verdict = None  # none in the job folder: a fit watched alone (no other worker's)
            with contextlib.suppress(OSError), open(self.stall_path) as f:
                verdict = f.read()
            return "StallError", None, self.exited_at, verdict
        # Killed by a signal (no report): it died after it was last seen alive, before the
        # errors its peers raised on losing it (a collective's closed connection), so it
        # counts from then, and comes first. The kernel closes a killed process's sockets
        # while it tears the process down, before the launcher can see it exit: a peer's
        # error can come before the last sight of it alive, by that teardown at most.
        signalled = self.proc.returncode is not None and self.proc.returncode < 0
        died = (self.alive_at - _TEARDOWN_S if signalled and self.alive_at is not None
                else self.exited_at)
        return record if record is not None else (None, None, died, None)

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


def _relay(pipe: Any, label: str, stream_name: str, tails: tuple[collections.deque, ...],
           log_path: str, shown: bool, quiet: bool = False) -> None:
    """Copies one of a worker's pipes to its log file, and to ours when `shown` (without the
    backends' runtime log lines when `quiet`: `launch._quiet`)."""
    prefix = f"[{label}] "
    runtime_lines = RuntimeLines() if quiet else None
    # O_APPEND: the stdout and stderr relays add whole lines to one file without a lock.
    log = _open_log(log_path)
    with pipe, log if log is not None else contextlib.nullcontext():
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            for tail in tails:
                tail.append(line)
            if log is not None:
                with contextlib.suppress(OSError):
                    log.write(raw if raw.endswith(b"\n") else raw + b"\n")
            if not shown or (runtime_lines is not None and runtime_lines.hides(line)):
                continue
            with _output_lock:
                try:
                    stream = getattr(sys, stream_name)
                    stream.write(f"{prefix}{line}\n")
                    stream.flush()
                except (AttributeError, OSError, ValueError):
                    pass  # no usable stream: the line is dropped, the worker goes on


def _open_log(path: str) -> Any:
    try:
        return open(path, "ab", buffering=0)  # noqa: SIM115 - closed by the relay's `with`
    except OSError as err:
        print(f"kmp.launch: cannot write the worker log {path}: {err}", file=sys.stderr)
        return None
