"""Exceptions of `kmp.launch` and `kmp-launch`, and how a worker's exit is named.

Their public home is `keras_mgpu_plugins.launch`, which re-exports them; they live
here so that the process supervision (`_supervisor`) and the worker bootstrap can
import them without the launcher's code.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence


class LaunchError(Exception):
    """A local multi-worker run could not be started or completed."""


class NotPicklableError(LaunchError, TypeError):
    """`fn`, `args` or `kwargs` cannot be sent to the workers with cloudpickle."""


class WorkerFailedError(LaunchError, RuntimeError):
    """A worker raised, exited non-zero or died; the other workers were stopped.

    Attributes:
        worker_index: Index of the first worker to fail.
        num_workers: Number of workers in the run.
        exitcode: Its exit code; `-N` when killed by signal `N`.
        signal: Name of that signal (`"SIGKILL"`), or `None`.
        remote_traceback: Traceback text from the worker, or `None` if it died
            without reporting one (then the message shows its last stderr lines).
        remote_exception: The worker's exception, when it could be unpickled.
        other_failures: Index to exit code of the other workers that failed on
            their own before being stopped.
        summary: One-line description of the failure.
        log_path: The failing worker's log file (all of its output), or `None`.
        output_shown: Whether its output was relayed to the launcher's terminal
            (`False`: only its log file has it; the message ends with its last lines).
        output_tail: Its last lines of output (stdout and stderr).
    """

    def __init__(self, message: str, *, summary: str, worker_index: int, num_workers: int,
                 exitcode: int | None, remote_traceback: str | None = None,
                 remote_exception: BaseException | None = None,
                 other_failures: Mapping[int, int | None] | None = None,
                 log_path: str | None = None, output_shown: bool = True,
                 output_tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.summary = summary
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.exitcode = exitcode
        self.signal = signal_name(exitcode)
        self.remote_traceback = remote_traceback
        self.remote_exception = remote_exception
        self.other_failures = dict(other_failures or {})
        self.log_path = log_path
        self.output_shown = output_shown
        self.output_tail = list(output_tail)


class LaunchTimeoutError(LaunchError, TimeoutError):
    """The run outlasted its timeout; every worker was stopped.

    The message names the workers still running, where each one was (inside
    TensorFlow or JAX, or the line of Python), and holds their Python stacks.

    Attributes:
        timeout: The timeout, in seconds.
        running_workers: Indices of the workers still running at expiry.
        stacks: For each of them, the Python stacks of all its threads as it printed
            them at expiry, or `None` if it did not answer (its Python was blocked).
    """

    def __init__(self, message: str, *, timeout: float, running_workers: Sequence[int],
                 stacks: Mapping[int, str | None] | None = None) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.running_workers = list(running_workers)
        self.stacks = dict(stacks or {})


class JobStoppedError(LaunchError):
    """A stop signal (SIGTERM, SIGUSR1) stopped the job; every worker was stopped.

    With `kmp.callbacks.BackupAndRestore` in the running `fit`, every worker stopped at
    the step they agreed on once the backup held it: the same call (or command) again
    resumes there. The message says which, where, and what to do.

    Attributes:
        signal: Name of the signal (`"SIGTERM"`).
        saved: Whether every worker stopped with the backup of that step written.
        exit_code: What `kmp-launch` exits with: 75 (`errors.STOPPED_EXIT_CODE`) when
            saved, else `128 + signal number`.
        epoch: The epoch to resume (0-based), where saved.
        batches_done: Batches of it already trained, where saved.
        backup_dir: The backup's folder, where saved.
        forwarded: Whether the launcher received the signal and forwarded it.
        records: Each stopped worker's report (`errors.TrainingStopped.record()`).
    """

    def __init__(self, message: str, *, signal: str, saved: bool, exit_code: int,
                 epoch: int | None = None, batches_done: int | None = None,
                 backup_dir: str | None = None, forwarded: bool = False,
                 records: Mapping[int, Mapping] | None = None) -> None:
        super().__init__(message)
        self.signal, self.saved, self.exit_code = signal, saved, exit_code
        self.epoch, self.batches_done, self.backup_dir = epoch, batches_done, backup_dir
        self.forwarded = forwarded
        self.records = {i: dict(r) for i, r in (records or {}).items()}


# Tracebacks and pickles name them by their public module.
for _error in (LaunchError, NotPicklableError, WorkerFailedError, LaunchTimeoutError,
               JobStoppedError):
    _error.__module__ = "keras_mgpu_plugins.launch"


def signal_name(exitcode: int | None) -> str | None:
    """Name of the signal that killed a process ending with `exitcode` (`-9`: `"SIGKILL"`).

    `None` when it was not killed by a signal (`exitcode` is `None` or non-negative).
    """
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return str(-exitcode)


def describe_exit(code: int | None) -> str:
    """`"signal SIGKILL (exit code -9)"` or `"exit code 3"`."""
    name = signal_name(code)
    return f"signal {name} (exit code {code})" if name else f"exit code {code}"


def named(indices: list[int]) -> str:
    """`"worker 1"`, `"workers 0, 1"`."""
    return f"worker{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"
