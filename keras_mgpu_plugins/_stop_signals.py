"""Stop signals (SIGTERM, SIGUSR1): the one place a worker handles them. No backend import.

A scheduler stops a job with a signal: SLURM sends the one of `--signal` before a
preemption or the time limit, Kubernetes sends SIGTERM when it evicts a pod, `kmp-launch`
forwards the SIGTERM or SIGUSR1 it receives to every worker. Here a stop signal never
kills a worker in the middle of a step:

- during a `fit` with `kmp.callbacks.BackupAndRestore` (`arm`ed): the signal is recorded
  (`requested`); at the workers' next check (`callbacks._stopping.Checks`: at most
  `stop_check_interval` seconds apart) every worker learns it (one worker that got it is
  enough), the backup is written at that step, and every worker raises
  `errors.TrainingStopped` with `STOPPED_EXIT_CODE` (75): run again to resume;
- otherwise: the worker says that nothing was saved and how to save, and raises
  `TrainingStopped` with `128 + signal` (143 for SIGTERM), a clean exit (every `finally`
  runs) where the default action would kill it mid-step.

A second stop signal while a backup is being written is said and ignored: the worker
exits once the backup is whole. Under `kmp-launch` a worker whose `fit` saves at a signal
says so in the job folder (`SAVING`), so that the launcher, forwarding a signal, says what
will happen: a stop at an agreed step, saved, or a stop with nothing saved. A signal the launcher sends to stop its workers itself
(after a failure, at its timeout, on Ctrl-C) is no request: it first writes `HARD_STOP`
in the job folder (`KMP_JOB_DIR`) and the worker then ends as the signal's default
action would.

The handlers are installed by the launcher's workers and `python -m
keras_mgpu_plugins.run` (`prepare`), after the backend's runtime (TensorFlow's and JAX's
coordination services install a SIGTERM notifier of their own, which records the signal
and lets the process go on), and by `BackupAndRestore` for its `fit`. Python runs them
in the main thread between two bytecodes, so a step in progress always completes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from keras_mgpu_plugins.errors import TrainingStopped

#: The stop signals handled unless told otherwise.
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
#: The file the launcher writes in the job folder before it stops its workers itself.
HARD_STOP = "stop-now"
#: A worker's file in the job folder while it runs a `fit` that saves at a stop signal.
SAVING = "saving-{index}"
#: Seconds the job gets after a stop signal before it is killed (set by `kmp-launch`
#: from `--stop-grace`; export it in a scheduler's job to have it checked there).
STOP_GRACE_ENV = "KMP_STOP_GRACE"
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")

_lock = threading.Lock()
_state: dict[str, Any] = {"request": None, "armed": False, "repeats": 0, "plan": None}


@dataclasses.dataclass(frozen=True)
class Request:
    """A stop signal received during a `fit` that saves: its name and wall time."""

    signum: int
    name: str
    at: float


def parse(value: Any, argument: str = "stop_signals") -> tuple[int, ...]:
    """Signal numbers from names (`"SIGTERM"`, `"TERM"`), numbers, or a sequence of them.

    `None` or an empty sequence: no stop signal.

    Raises:
        ValueError: Naming the value, for an unknown signal or one that cannot be caught.
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, (str, int)) else list(value) if isinstance(
        value, Iterable) else None
    numbers: list[int] = []
    for item in items if items is not None else [value]:
        number = _number(item)
        if number is None or signal.Signals(number).name in _UNCATCHABLE:
            valid = ", ".join(n for n in ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP"))
            raise ValueError(
                f"{argument} must be signal names or numbers that a process can catch (e.g. "
                f"{valid}; not SIGKILL or SIGSTOP), or None for none. Received: "
                f"{argument}={value!r}")
        if number not in numbers:
            numbers.append(number)
    return tuple(numbers)


def _number(item: Any) -> int | None:
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        try:
            return int(signal.Signals(item))
        except ValueError:
            return None
    if isinstance(item, str):
        name = item.strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        member = getattr(signal.Signals, name, None)
        return int(member) if member is not None else None
    return None


def name(signum: int) -> str:
    return signal.Signals(signum).name


def install(signums: Iterable[int]) -> Callable[[], None] | None:
    """Handles `signums` here (see the module docstring); returns the undo.

    Returns `None` (nothing installed) outside the main thread, where Python cannot
    install a handler.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {s: signal.getsignal(s) for s in signums}
    for s in previous:
        signal.signal(s, _handle)

    def undo() -> None:
        for s, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):  # e.g. None: set outside Python
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    return undo


def arm() -> None:
    """A `fit` that saves at a stop signal begins: signals are requests from now on (one
    received before, and not acted on, is kept: that `fit` stops before its first step).

    Armed from inside a `fit` (`BackupAndRestore.on_train_begin`), a signal that finds the
    main thread outside any `fit` is no request: that `fit` raised (Keras then calls no
    `on_train_end`), and the signal stops the process as unarmed."""
    with _lock:
        _state["armed"], _state["armed_in_fit"] = True, _in_fit(sys._getframe(1))
        _state["plan"] = None
    _mark_saving(True)


def disarm() -> None:
    """That `fit` ended: a signal stops the process again; a pending request is dropped."""
    with _lock:
        _state["armed"], _state["request"], _state["repeats"] = False, None, 0
        _state["plan"] = None
    _mark_saving(False)


def plan(describe: Callable[[], str] | None) -> None:
    """How the armed `fit` says when it acts on a signal (`"at the workers' next check, in
    12 steps ..."`), for the handler's message."""
    _state["plan"] = describe


def stop_grace(environ: Any = None) -> float | None:
    """The job's stop grace in seconds (`STOP_GRACE_ENV`), or `None` where not given.

    Raises:
        ValueError: For a value that is not a positive number of seconds.
    """
    text = (os.environ if environ is None else environ).get(STOP_GRACE_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{STOP_GRACE_ENV} must be a positive number of seconds. Received: "
                         f"{STOP_GRACE_ENV}={text!r}")
    return value


def saving_workers(job_dir: str) -> list[int]:
    """The workers of a `kmp-launch` job running a `fit` that saves at a stop signal now."""
    prefix = SAVING.split("{", 1)[0]
    try:
        names = os.listdir(job_dir)
    except OSError:
        return []
    return sorted(int(n[len(prefix):]) for n in names
                  if n.startswith(prefix) and n[len(prefix):].isdigit())


def _mark_saving(saving: bool) -> None:
    job_dir, index = os.environ.get("KMP_JOB_DIR"), os.environ.get("KMP_WORKER_INDEX")
    if not job_dir or not index:
        return
    path = os.path.join(job_dir, SAVING.format(index=index))
    with contextlib.suppress(OSError):
        if saving:
            with open(path, "w"):
                pass
        else:
            os.remove(path)


def requested() -> Request | None:
    """The stop signal received during the armed `fit`, if any (or a notice a `watch`ed source
    gave: it counts as SIGTERM). Every source is asked at every call, whatever this worker
    already holds: a source may be a collective (Ray's notice is a barrier over the group),
    which every worker must call as often as the others."""
    for source in list(_state.get("sources", ())):
        notice = source()
        if notice and _state["request"] is None:
            say(f"{who()}: {notice}: training stops at the next step every worker agrees "
                "on, once BackupAndRestore has saved that step.")
            _state["request"] = Request(int(signal.SIGTERM), notice, time.time())
    return _state["request"]


def watch(source: Callable[[], str | None]) -> Callable[[], None]:
    """Asks `source` at each check of a `fit` that saves (where no handler can be installed:
    Ray Train runs `fit` in a thread) for a stop notice (a text naming it, or `None`); returns
    the undo. Every worker asks at the same checks, so a source may be a collective."""
    with _lock:
        _state.setdefault("sources", []).append(source)

    def undo() -> None:
        with _lock:
            if source in _state.get("sources", ()):
                _state["sources"].remove(source)
            _state["request"] = None

    return undo


def who() -> str:
    """How this process names itself in messages: `"kmp: worker 1 of 2"`, or `"kmp"`."""
    index = os.environ.get("KMP_WORKER_INDEX") or os.environ.get("SLURM_PROCID")
    count = os.environ.get("KMP_NUM_WORKERS") or os.environ.get("SLURM_NTASKS")
    return f"kmp: worker {index} of {count}" if index and count else "kmp"


def say(message: str) -> None:
    """Writes one line to stderr without Python's buffered streams (safe in a handler)."""
    with contextlib.suppress(OSError):
        os.write(2, f"{message}\n".encode())


def nothing_saved(signum: int) -> TrainingStopped:
    """The exception (and its printed message) for a stop signal outside a `fit` that saves."""
    signal_name = name(signum)
    message = (
        f"{who()} received {signal_name} and stops; nothing was saved: no fit with "
        "kmp.callbacks.BackupAndRestore was running. To save the training state at the step "
        "a stop signal arrives and resume from it, pass "
        "callbacks=[kmp.callbacks.BackupAndRestore(backup_dir=...)] to fit "
        f"(exit code {128 + signum}).")
    return TrainingStopped(message, signal=signal_name, saved=False, code=128 + signum)


def _hard_stop() -> bool:
    job_dir = os.environ.get("KMP_JOB_DIR")
    return bool(job_dir) and os.path.exists(os.path.join(job_dir, HARD_STOP))


def _in_fit(frame: Any) -> bool:
    """Whether the interrupted main thread is inside a `fit` (Keras's or kmp's loop)."""
    while frame is not None:
        if (frame.f_code.co_name == "fit"
                and str(frame.f_globals.get("__name__", "")).startswith("keras")):
            return True
        frame = frame.f_back
    return False


def _handle(signum: int, frame: Any) -> None:
    if _hard_stop():  # the launcher stops its workers itself: end as the signal would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    with _lock:
        if (_state["armed"] and _state.get("armed_in_fit") and frame is not None
                and not _in_fit(frame)):
            # a fit that raised (no on_train_end) left it armed: no fit will act on a request
            _state["armed"], _state["request"], _state["repeats"] = False, None, 0
        armed, first = _state["armed"], _state["request"] is None
        if armed and first:
            _state["request"] = Request(signum, name(signum), time.time())
        elif armed:
            _state["repeats"] += 1
    if armed and first:
        describe = _state.get("plan")
        try:
            when = describe() if describe is not None else "at the workers' next check"
        except Exception:  # noqa: BLE001 - a message must never fail the handler
            when = "at the workers' next check"
        say(f"{who()} received {name(signum)}: training stops {when}, once "
            "BackupAndRestore has saved that step.")
    elif armed:
        say(f"{who()} received {name(signum)} again: already stopping; the worker exits once "
            "the backup is whole (SIGKILL ends it now, keeping the previous backup).")
    else:
        error = nothing_saved(signum)
        say(error.message)
        raise error
