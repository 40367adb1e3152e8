"""`kmp-launch --max-restarts N` / `kmp.launch(max_restarts=N)`: a job that was stopped or
lost a worker runs again, up to N times, resuming from its backup.

A run is restarted when it ended with:

- `JobStoppedError` after a stop signal a *worker* received (a scheduler stopped one of
  them): with `kmp.callbacks.BackupAndRestore` the rerun resumes at the step the workers
  agreed on; without it, from the start (said);
- `WorkerFailedError` for a worker killed by a signal (SIGKILL, the out-of-memory killer,
  a crash): the rerun resumes from the last backup `BackupAndRestore` wrote.

Never restarted: a stop signal the launcher itself received (the job is being stopped),
a worker that raised or exited with an error (a rerun would fail the same way), the
timeout, Ctrl-C. Each restart is named on stderr with its cause; the workers of restart
`k` see `KMP_RESTART=k` (0 for the first run).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.launch._errors import JobStoppedError, WorkerFailedError

#: The variable telling each worker which run of the job it belongs to (0: the first).
RESTART_ENV = "KMP_RESTART"


def cause(error: BaseException) -> str | None:
    """Why `error`'s run is restarted (`"..."`), or `None` when it is not restartable."""
    if isinstance(error, JobStoppedError):
        if error.forwarded or not error.records:  # the launcher was told to stop
            return None
        if error.saved:
            return (f"the job was stopped by {error.signal}; resuming from the backup in "
                    f"{error.backup_dir} (epoch {error.epoch + 1}, after {error.batches_done} "
                    "of its batches)")
        return f"the job was stopped by {error.signal}; starting again: nothing was saved"
    if isinstance(error, WorkerFailedError) and error.exitcode is not None and error.exitcode < 0:
        return f"{_first(error.summary)}; resuming from the last backup"
    return None


def why_not(error: BaseException) -> str:
    """Why `error`'s run is not restarted, for the message."""
    if isinstance(error, JobStoppedError):
        return "the launcher itself was told to stop"
    if isinstance(error, WorkerFailedError):
        return f"{_first(error.summary)}, which a rerun would do again"
    return f"{type(error).__name__}"


def _first(summary: str) -> str:
    """The first sentence of a failure's summary, without its full stop."""
    return summary.split(". ")[0].rstrip(".")


def run(once: Callable[[int], Any], max_restarts: int, program: str) -> Any:
    """`once(k)` for `k` = 0, 1, ...: until it returns, or raises what is not restartable,
    or `max_restarts` restarts are spent (the last error is raised)."""
    attempt = 0
    while True:
        try:
            return once(attempt)
        except (JobStoppedError, WorkerFailedError) as error:
            reason = cause(error)
            if max_restarts and (reason is None or attempt >= max_restarts):
                spent = (f"all {max_restarts} restarts were made" if reason is not None
                         else why_not(error))
                print(f"{program}: not restarted: {spent}.", file=sys.stderr, flush=True)
            if reason is None or attempt >= max_restarts:
                raise
            attempt += 1
            print(f"{program}: restart {attempt} of {max_restarts}: {reason}.",
                  file=sys.stderr, flush=True)


def check(max_restarts: Any) -> None:
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError("max_restarts must be an integer at least 0. "
                         f"Received: max_restarts={max_restarts!r}")
