"""The signals the launcher receives while its workers run, and what it does with them.

- SIGINT (Ctrl-C): an interrupt. The supervisor stops every worker at once (its hard
  stop: `_stop_signals.HARD_STOP` first, so that a worker ends as the signal's default
  action would, nothing saved) and raises `KeyboardInterrupt` (exit code 130).
- SIGTERM, SIGUSR1 (`STOPS`, what SLURM's `--signal`, Kubernetes and a user's `kill`
  send): forwarded to every worker's main process, which stops at the step the workers
  agree on once `kmp.callbacks.BackupAndRestore` has saved it (`_stop_signals`). The
  launcher waits for them up to `stop_grace` seconds, then stops them; a second stop
  signal (or Ctrl-C) stops them at once.

Handlers only record: a `KeyboardInterrupt` raised anywhere would be unsafe (raised inside
`Popen.poll()` after it took its internal lock, CPython takes it before its `try`, it leaves
that lock held, and stopping the workers then waits on it forever). The supervisor acts at
its safe point. Only Python's default handlers, in the main thread, are replaced; a
handler of the caller's own is left alone. Every ending (a stop, Ctrl-C, a failed
worker, a timeout) then goes through the launcher's `finally`, which removes the job's
private folder (spec, payload, job folder).
"""

from __future__ import annotations

import collections
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from keras_mgpu_plugins import _stop_signals
from keras_mgpu_plugins.errors import STOPPED_EXIT_CODE
from keras_mgpu_plugins.launch._errors import JobStoppedError, named

#: The signals forwarded to the workers as stop requests.
STOPS = (signal.SIGTERM, signal.SIGUSR1)
#: Seconds the workers get, after a stop signal, to save at the agreed step and exit.
DEFAULT_STOP_GRACE_S = 120.0


class Caught:
    """What arrived: `interrupted` (Ctrl-C) and the stop signals, in order (`take_stop`)."""

    def __init__(self) -> None:
        self.interrupted = threading.Event()
        self._stops: collections.deque[int] = collections.deque()

    def _record(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            self.interrupted.set()
        else:
            self._stops.append(signum)

    def take_stop(self) -> int | None:
        """The next stop signal received and not taken yet, if any."""
        try:
            return self._stops.popleft()
        except IndexError:
            return None


def _defaults() -> dict[int, object]:
    return {signal.SIGINT: signal.default_int_handler,
            **{s: signal.SIG_DFL for s in STOPS}}


@contextlib.contextmanager
def caught() -> Iterator[Caught | None]:
    """While workers run, the signals above are recorded (see the module docstring).

    Yields:
        The record, or `None` outside the main thread (nothing handled here).
    """
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    record = Caught()
    replaced = {}
    for signum, default in _defaults().items():
        if signal.getsignal(signum) is default:
            replaced[signum] = default
            signal.signal(signum, record._record)
    try:
        yield record
    finally:
        for signum, default in replaced.items():
            signal.signal(signum, default)  # type: ignore[arg-type]


def forward(workers: list[Any], signum: int, stop_grace: float, program: str,
            job_dir: str | None = None) -> None:
    """Sends a stop signal to every worker's main process (not its data loaders), saying
    what the workers will do: save at an agreed step where a `fit` with BackupAndRestore
    runs (`_stop_signals.saving_workers`), else stop with nothing saved."""
    saving = bool(job_dir and _stop_signals.saving_workers(job_dir))
    print(forward_notice(signum, stop_grace, program, saving), file=sys.stderr, flush=True)
    for w in workers:
        if not w.check_exit():
            with contextlib.suppress(OSError):
                w.proc.send_signal(signum)


def forward_notice(signum: int, stop_grace: float, program: str, saving: bool) -> str:
    """The launcher's line when it forwards a stop signal, true for this job."""
    name = _stop_signals.name(signum)
    again = f"{name} again stops them at once"
    if saving:
        return (f"{program}: {name} received: forwarded to every worker; in the fit with "
                "BackupAndRestore they stop at the next step they check together and save it "
                f"there ({stop_grace:g} s at most; {again}).")
    return (f"{program}: {name} received: forwarded to every worker; no worker runs a fit with "
            "kmp.callbacks.BackupAndRestore, so they stop now and nothing is saved (pass "
            "callbacks=[kmp.callbacks.BackupAndRestore(backup_dir=...)] to fit to save at a "
            f"stop signal; {again}).")


def stopped_error(workers: list[Any], forwarded: int | None,
                  program: str) -> JobStoppedError | None:
    """The `JobStoppedError` to raise when a stop signal stopped the workers (none failed),
    saying where the state was saved, or that nothing was; else `None`."""
    records = {w.index: w.stopped_record() for w in workers if w.stopped()}
    if not records:
        return None
    chief = records.get(0) or records[min(records)]
    saved = len(records) == len(workers) and all(r.get("saved") for r in records.values())
    received = sorted(i for i, r in records.items() if r.get("received"))
    sent = (f"sent to {program}, which forwarded it to every worker" if forwarded is not None
            else f"received by {named(received)}" if received else "received by a worker")
    if saved:
        again = "call kmp.launch again" if program == "kmp.launch" else "run the same command again"
        where = (f"in epoch {chief['epoch'] + 1}, after {chief['batches_done']} of its batches"
                 if chief["batches_done"] else f"at the end of epoch {chief['epoch']}"
                 if chief["epoch"] else "before the first step")
        message = (f"The job was stopped by {chief['signal']} ({sent}) {where}, the "
                   f"step every worker agreed on; BackupAndRestore saved it in "
                   f"{chief['backup_dir']}: {again} to resume (exit code {STOPPED_EXIT_CODE}).")
        code = STOPPED_EXIT_CODE
    else:
        code = int(chief.get("code") or 128 + signal.SIGTERM)
        message = (f"The job was stopped by {chief['signal']} ({sent}); nothing was saved: no "
                   "fit with kmp.callbacks.BackupAndRestore was running in "
                   f"{named(sorted(i for i, r in records.items() if not r.get('saved')))} "
                   f"(exit code {code}).")
    return JobStoppedError(message, signal=chief["signal"], saved=saved, exit_code=code,
                          epoch=chief.get("epoch") if saved else None,
                          batches_done=chief.get("batches_done") if saved else None,
                          backup_dir=chief.get("backup_dir") if saved else None,
                          forwarded=forwarded is not None, records=records)


def again_error(signum: int, forwarded: int) -> JobStoppedError:
    """The error of a second stop signal (the workers were stopped at once)."""
    return JobStoppedError(
        f"{_stop_signals.name(signum)} received again while the workers were stopping after "
        f"{_stop_signals.name(forwarded)}: every worker was stopped at once; a backup being "
        "written was left out, the last whole one is kept.",
        signal=_stop_signals.name(signum), saved=False, exit_code=128 + signum)


def late_error(late: list[int], forwarded: int | None, stop_grace: float) -> JobStoppedError:
    """The error of workers that did not stop within `stop_grace` (they were stopped)."""
    signum = forwarded or signal.SIGTERM
    return JobStoppedError(
        f"{named(late)} did not stop within stop_grace={stop_grace:g} seconds after a stop "
        f"signal ({_stop_signals.name(signum)}): every worker was stopped at once; the last "
        "whole backup is kept.", signal=_stop_signals.name(signum), saved=False,
        exit_code=128 + signum)
