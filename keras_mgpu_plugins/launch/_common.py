"""What `kmp.launch` and `kmp-launch` share: argument checks, the workers' environment, the run."""

from __future__ import annotations

import math
import os
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from keras_mgpu_plugins.launch._errors import LaunchError
from keras_mgpu_plugins.launch._signals import DEFAULT_STOP_GRACE_S

WORKER_ENV_VARS = ("TF_CONFIG", "KMP_LAUNCH_WORKER", "KMP_NUM_WORKERS", "KMP_WORKER_INDEX",
                   "KMP_JOB_DIR", "KMP_RESTART", "KMP_STOP_GRACE")

#: Seconds without progress on every worker after which the launcher's `StallWatchdog`
#: fails the job, unless told otherwise. The examples' first steps (compilation included)
#: took at most 1.8 s on a 2-core CPU (`benchmarks/first_step.py`, docs/launch.md): 600 s
#: leaves a big model's compilation (minutes on a GPU) room, and is `StallWatchdog`'s own
#: default.
DEFAULT_STALL_TIMEOUT = 600.0
#: The launcher's default stall timeout where set: seconds, or 0 for no watchdog.
STALL_TIMEOUT_ENV = "KMP_STALL_TIMEOUT"




def _run(spec: dict, num_workers: int, timeout: float | None, environ: dict[str, str],
         payload: bytes | None = None, output: str = "chief",
         log_dir: str | None = None, stop_grace: float = DEFAULT_STOP_GRACE_S,
         max_restarts: int = 0) -> list[Any]:
    """Runs the job, and again after a stop or a lost worker, up to `max_restarts` times
    (`launch._restarts`): one job id for every run."""
    # Imported here: a worker, started as `-m keras_mgpu_plugins.launch._worker`, imports
    # this package first, and must not have imported its own module already.
    from keras_mgpu_plugins.launch import _restarts
    from keras_mgpu_plugins.launch._supervisor import run

    if max_restarts:
        environ = {**environ, "KMP_JOB_ID": environ.get("KMP_JOB_ID") or uuid.uuid4().hex[:12]}

    def once(attempt: int) -> list[Any]:
        return run(spec, num_workers, timeout, {**environ, _restarts.RESTART_ENV: str(attempt)},
                   payload, output, log_dir, stop_grace)

    program = "kmp.launch" if payload is not None else "kmp-launch"
    return _restarts.run(once, max_restarts, program)


def _check_common(num_workers: Any, timeout: Any) -> None:
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ValueError(
            f"num_workers must be a positive integer. Received: num_workers={num_workers!r}")
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
        or not math.isfinite(timeout) or timeout <= 0
    ):
        raise ValueError(
            f"timeout must be a positive number of seconds or None. Received: timeout={timeout!r}")
    if not hasattr(os, "killpg"):
        raise LaunchError("kmp.launch needs a POSIX system (process groups); "
                          f"this is {sys.platform!r}.")


def _check_num_ps(num_ps: Any, environ: Mapping[str, str]) -> None:
    """Raises for a bad `num_ps`, or parameter servers on a Keras backend without them."""
    if not isinstance(num_ps, int) or isinstance(num_ps, bool) or num_ps < 0:
        raise ValueError(
            f"num_ps must be a non-negative integer (0: no parameter servers). Received: "
            f"num_ps={num_ps!r}")
    backend = environ.get("KERAS_BACKEND", "tensorflow")
    if num_ps and backend != "tensorflow":
        raise ValueError(
            f"num_ps starts TensorFlow's parameter servers, which Keras has on the TensorFlow "
            f"backend only (for JAX it is a Keras proposal, keras-team/keras#20753). Received: "
            f"num_ps={num_ps}, KERAS_BACKEND={backend!r}. Use KERAS_BACKEND=tensorflow, or "
            f"num_ps=0: every process then trains data parallel (strategy=\"multi_worker\").")


def _worker_environ(env: Mapping[str, str | None] | None) -> dict[str, str]:
    environ = dict(os.environ)
    if env is None:
        return environ
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict of str to str or None. Received: env={env!r}")
    for key, value in env.items():
        if not isinstance(key, str) or not (value is None or isinstance(value, str)):
            raise TypeError(f"env must map str to str or None. Received: env[{key!r}]={value!r}")
        if key in WORKER_ENV_VARS:
            raise ValueError(
                f"env may not set {key}: kmp.launch sets it for each worker (reserved: "
                f"{', '.join(WORKER_ENV_VARS)}). Received: env={dict(env)!r}")
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return environ


def resolve_stall_timeout(stall_timeout: Any, environ: Mapping[str, str] | None = None) -> float | None:
    """The `StallWatchdog` timeout of every `fit` in the workers, or `None` for none.

    Args:
        stall_timeout: Seconds (a positive number), `None` (no watchdog), or `"auto"`:
            `KMP_STALL_TIMEOUT` where set (seconds; `0` for none), else
            `DEFAULT_STALL_TIMEOUT`.
        environ: Where `KMP_STALL_TIMEOUT` is read (default: `os.environ`).

    Raises:
        ValueError: For any other value, or a `KMP_STALL_TIMEOUT` that is not a number
            of seconds at least 0.
    """
    if isinstance(stall_timeout, str) and stall_timeout == "auto":
        text = (os.environ if environ is None else environ).get(STALL_TIMEOUT_ENV, "").strip()
        if not text:
            return DEFAULT_STALL_TIMEOUT
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                f"{STALL_TIMEOUT_ENV} must be a number of seconds (0: no StallWatchdog). "
                f"Received: {STALL_TIMEOUT_ENV}={text!r}")
        return seconds or None
    if stall_timeout is None:
        return None
    if (isinstance(stall_timeout, bool) or not isinstance(stall_timeout, (int, float))
            or not math.isfinite(stall_timeout) or stall_timeout <= 0):
        raise ValueError(
            'stall_timeout must be a positive number of seconds, None (no StallWatchdog) or '
            f'"auto" ({STALL_TIMEOUT_ENV} where set, else {DEFAULT_STALL_TIMEOUT:g}). '
            f"Received: stall_timeout={stall_timeout!r}")
    return float(stall_timeout)
