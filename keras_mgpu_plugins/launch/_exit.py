"""How a worker process that failed reports and ends: shared by the launcher's worker
bootstrap (`launch/_worker.py`) and the scheduler runner (`keras_mgpu_plugins.run`)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import runpy
import sys
import threading
import traceback

#: Seconds `atexit` handlers get after a failure before the process ends.
EXIT_GRACE_S = 5.0


@functools.cache
def _bootstrap_files() -> tuple[str, ...]:
    """The files whose frames start user code (left out of its traceback), found unimported."""
    found = [runpy.__file__]
    for name in ("keras_mgpu_plugins.launch._worker", "keras_mgpu_plugins.run"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append(spec.origin)
    return tuple(found)


def _user_traceback(err: BaseException) -> str:
    """The traceback text of `err` without the bootstrap's own frames, as Python prints it."""
    tb = err.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in _bootstrap_files()
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb))


def _exit_after_failure(code: int, grace: float = EXIT_GRACE_S) -> None:
    """Exits with `code` even when TensorFlow's runtime would hold the interpreter.

    After a failure the collective runtime can block interpreter shutdown (an
    all-reduce still waits for a peer), and the launcher would then report a kill
    instead of this exit code. The failure is already recorded; `atexit` handlers
    (e.g. a W&B run's flush) get `grace` seconds, then the process ends.
    """
    import atexit

    finisher = threading.Thread(target=atexit._run_exitfuncs, daemon=True)
    finisher.start()
    finisher.join(grace)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
