"""A process of a multi-process job that raises ends at once, on every lane, however the job
was started. No backend import.

An exception no one catches ends a Python script: Python prints it, runs the `atexit`
handlers and exits 1. In a job of several processes those handlers can wait for the other
processes forever: `jax.distributed`'s shutdown meets every process at a barrier, while the
others wait in the step's collective for this one (measured: 2 JAX processes started with
`TF_CONFIG` by hand, process 1 raising in a callback: both still there after 240 s). The
launcher's workers and the scheduler runner (`python -m keras_mgpu_plugins.run`) end such a
process themselves (`launch._exit`); a script started by hand, by `srun python` or by
`torchrun` gets the same here: once kmp sees the job (`kmp.parallelize` in a job of several
processes), an uncaught exception is printed as Python prints it (by every hook installed
around this one: torch's prefixes the rank), then the process ends as Python ends it, but for
a deadline: whatever still runs `EXIT_GRACE_S` seconds later (an `atexit` handler waiting for
a peer) no longer holds it, and it exits 1. Its peers then fail in their next collective,
which reaches a closed connection, and end the same way.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any

from keras_mgpu_plugins.launch._exit import EXIT_GRACE_S

_installed: list[Any] = []


def install() -> None:
    """Makes an uncaught exception end this process at once (idempotent)."""
    if _installed:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        code = 130 if issubclass(kind, KeyboardInterrupt) else 1
        threading.Thread(target=_exit_later, args=(code,), name="kmp-fail-fast",
                         daemon=True).start()

    sys.excepthook = hook
    _installed.append(hook)


def _exit_later(code: int, grace: float = EXIT_GRACE_S) -> None:
    """Ends the process with `code` in `grace` seconds, if Python has not ended it by then."""
    time.sleep(grace)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def install_if_job() -> None:
    """`install()` where the environment describes a job of several processes."""
    import os

    from keras_mgpu_plugins.cluster.topology import topology_from_env

    if topology_from_env(os.environ).is_multi_worker:
        install()
