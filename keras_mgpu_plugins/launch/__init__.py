"""Local multi-worker runs: `kmp.launch(fn)` and the `kmp-launch` command.

Each worker is a fresh Python process (never a fork) in its own session, with a
`TF_CONFIG` describing a localhost cluster on free ports, the parent's
environment, working directory and (for `launch`) `sys.path`. Each worker's
output (stdout and stderr) goes to its log file,
`<tempdir>/kmp-launch-logs/<job id>/worker-<i>.log`; the chief's (worker 0's),
or with `output="all"` every worker's, is also relayed line by line with a
`[worker i] ` prefix, and non-chief workers' Keras progress bars are off
unless `output="all"` (`KMP_OUTPUT`, see docs/launch.md). Workers sharing the host
get their share of its cores for TensorFlow's thread pools, and glibc's top pad
(`launch._tuning`), unless the user set those variables. Pickled payloads travel
through a private temporary folder (mode 0700), never over the network.

The run fails fast: when a worker raises, exits non-zero or dies, every other
worker, and anything the workers started, is stopped within seconds and the
first failure is raised with the worker's remote traceback. Workers also stop
when the launcher itself dies. POSIX only (process groups). The processes are
handled in `launch._supervisor` (one process in `launch._process`), the worker
side in `launch._worker`, the exceptions live in `launch._errors`; `kmp-launch`
and `python -m keras_mgpu_plugins.launch` run `main` (`launch._cli`).
"""

from __future__ import annotations

import copyreg
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keras_mgpu_plugins.launch import _restarts
from keras_mgpu_plugins.launch._common import (  # noqa: F401 - re-exported
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_STOP_GRACE_S,
    STALL_TIMEOUT_ENV,
    WORKER_ENV_VARS,
    _check_common,
    _check_num_ps,
    _run,
    _worker_environ,
    resolve_stall_timeout,
)
from keras_mgpu_plugins.launch._errors import (
    JobStoppedError,
    LaunchError,
    LaunchTimeoutError,
    NotPicklableError,
    WorkerFailedError,
)

#: Variables the launcher sets in each worker; `env` may not override them.


def launch(fn: Callable[..., Any], num_workers: int = 2, args: Sequence[Any] = (),
           kwargs: Mapping[str, Any] | None = None, timeout: float | None = None, *,
           num_ps: int = 0,
           create_strategy: bool = True, env: Mapping[str, str | None] | None = None,
           output: str = "chief", log_dir: str | None = None,
           stall_timeout: float | str | None = "auto",
           stop_grace: float = DEFAULT_STOP_GRACE_S, max_restarts: int = 0) -> list[Any]:
    """Runs `fn(*args, **kwargs)` in `num_workers` fresh local worker processes.

    Each worker gets `TF_CONFIG` for a localhost cluster of `num_workers`
    workers, `KMP_LAUNCH_WORKER=1`, `KMP_NUM_WORKERS`, `KMP_WORKER_INDEX` and
    `KMP_JOB_ID` (one id for the whole run, the parent's if it has one),
    on top of the parent's environment, working directory and `sys.path`.
    With several workers and `create_strategy=True`, each worker creates its
    `MultiWorkerMirroredStrategy` (`kmp.strategy.get_strategy("multi_worker")`)
    before `fn` is even unpickled, as TensorFlow requires; `kmp.parallelize`
    in `fn` then uses it. With `KERAS_BACKEND=jax`, each worker initialises
    `jax.distributed` there instead (the coordinator on worker 0's port, bound
    to 127.0.0.1), and `kmp.parallelize` distributes over every process.

    With `num_ps` parameter servers the job is TensorFlow's parameter-server cluster
    (docs/parameter_server.md): a `"chief"` process runs `fn` and coordinates,
    `num_workers` `"worker"` processes run the steps it sends them and `num_ps` `"ps"`
    processes hold the variables; `@kmp.parallelize(strategy="parameter_server")` (or
    `"auto"`) in `fn` builds the model there. Workers and parameter servers run
    TensorFlow's server only. A worker that exits is started again (3 times at most):
    the chief's coordinator sends its steps to the other workers meanwhile. The chief,
    or a parameter server, failing fails the run as usual.

    In a run of `kmp-verify`, `fn` runs in the calling process (kmp-verify started the
    processes of its runs already: one for its one-device runs, N with `--processes`),
    and the list holds its one value.

    No hang is silent: every `fit` in the workers runs with a
    `kmp.callbacks.StallWatchdog(timeout=stall_timeout)` (one given to `fit` is
    kept), so a job in which no worker progresses for that long fails with every
    worker's Python stacks and the stuck one named. When `timeout` expires, the
    error names the workers that had not finished and holds their stacks.

    `fn` travels with cloudpickle: lambdas, closures and functions defined in
    `__main__` or a notebook work; a function from an importable module is sent
    by reference and imported in the worker. The source of what travels by value
    goes with it (`launch._source`), so that `inspect.getsource` and TensorFlow's
    AutoGraph (`tf.function`, `Dataset.map` with Python `if`/`for` over tensors)
    work in the workers as in one process.

    Args:
        fn: The function each worker calls.
        num_workers: Number of worker processes, at least 1.
        args: Positional arguments for `fn`.
        kwargs: Keyword arguments for `fn`.
        timeout: Seconds the whole run may take, or `None` for no limit. At
            expiry the workers still running print their Python stacks (in
            the error) before they are stopped.
        num_ps: Number of parameter servers (0: none, every worker runs `fn`). With
            parameter servers, `fn` runs on the chief only.
        create_strategy: Create the multi-worker strategy in each worker
            first. With `False`, the bootstrap imports no TensorFlow.
        env: Variables to set (or, with `None`, unset) in the workers.
        output: `"chief"`: only worker 0's output is shown here, without the
            backends' runtime log lines (TensorFlow's C++ logs, coordination and
            Gloo lines), the others' goes to their log files (path printed), and
            their Keras progress bars are off; `"verbose"`: the same with worker 0's
            runtime log lines; `"all"`: every worker's is shown, prefixed, with its
            progress bars. Every worker's output is in its log file either way.
        log_dir: Folder for the log files `worker-<i>.log` (default:
            `<tempdir>/kmp-launch-logs/<job id>`, kept after the run).
        stall_timeout: Seconds without progress on every worker before the
            `StallWatchdog` in each `fit` fails the job; `None` for no watchdog;
            `"auto"`: `KMP_STALL_TIMEOUT` where set (`0`: none), else
            `DEFAULT_STALL_TIMEOUT` (600 s, far above a first step's compilation).
        stop_grace: Seconds the workers get to stop after a stop signal (SIGTERM or
            SIGUSR1 sent to this process, forwarded to every worker, or sent to a
            worker): in a `fit` with `kmp.callbacks.BackupAndRestore` they save the
            step they agree on, then stop (docs/preemption.md).
        max_restarts: Run the job again, up to this many times, when a worker was
            stopped by a signal (not this process) or killed (SIGKILL, out of memory):
            `fn` resumes from what `kmp.callbacks.BackupAndRestore` saved. Each restart
            is named on stderr with its cause; the workers see `KMP_RESTART` (0, 1, ...).
            A worker that raised is never restarted.

    Returns:
        What `fn` returned in each worker, in worker order; with parameter servers,
        a list of one item: what `fn` returned on the chief.

    Raises:
        ValueError: For a bad `num_workers`, `num_ps`, `timeout`, `env`, `output` or
            `stall_timeout`; `num_ps` on a Keras backend other than TensorFlow.
        TypeError: For a non-callable `fn` or `args`/`kwargs`/`env` of the wrong type.
        NotPicklableError: If `fn`, `args` or `kwargs` cannot be pickled
            (raised before any process starts).
        WorkerFailedError: If a worker fails; the others are stopped.
        LaunchTimeoutError: If the run outlasts `timeout`, naming the workers
            still running, where each was, and their stacks.
        JobStoppedError: If a stop signal stopped the job: where the state was saved
            (call again to resume), or that nothing was.

    Example:
        >>> import keras_mgpu_plugins as kmp
        >>> kmp.launch(lambda: kmp.topology().worker_index, num_workers=2,
        ...            create_strategy=False)
        [0, 1]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable. Received: fn={fn!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or a list. Received: args={args!r}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict or None. Received: kwargs={kwargs!r}")
    from keras_mgpu_plugins.verify import _config as verify_run

    if verify_run.launches_in_place():  # kmp-verify started this run's processes already
        return [fn(*args, **(kwargs or {}))]
    _check_common(num_workers, timeout)
    _check_output(output, log_dir)
    _check_stop_grace(stop_grace)
    _restarts.check(max_restarts)
    environ = _worker_environ(env)
    _check_num_ps(num_ps, environ)
    watchdog = resolve_stall_timeout(stall_timeout, environ)  # KMP_STALL_TIMEOUT: env's too
    payload = _pickle_payload(fn, tuple(args), dict(kwargs or {}))
    spec = {"mode": "function", "sys_path": list(sys.path), "num_ps": num_ps,
            "create_strategy": bool(create_strategy), "stall_timeout": watchdog}
    return _run(spec, num_workers, timeout, environ, payload, output, log_dir, stop_grace,
                max_restarts)


def _check_stop_grace(stop_grace: Any) -> None:
    if (isinstance(stop_grace, bool) or not isinstance(stop_grace, (int, float))
            or not stop_grace > 0 or stop_grace == float("inf")):
        raise ValueError("stop_grace must be a positive number of seconds. "
                         f"Received: stop_grace={stop_grace!r}")


def _check_output(output: Any, log_dir: Any) -> None:
    if output not in ("chief", "verbose", "all"):
        raise ValueError(f'output must be "chief" (only worker 0\'s output shown, without the '
                         f'runtimes\' own log lines), "verbose" (worker 0\'s, all of it) or "all" '
                         f"(every worker's). Received: output={output!r}")
    if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(f"log_dir must be a path or None. Received: log_dir={log_dir!r}")


# `kmp.launch` may be this function or, once this module was imported by name,
# the module itself (the import system sets it on the package). Either way
# `kmp.launch(fn)` runs and `kmp.launch.WorkerFailedError` names the exception.
for _error in (LaunchError, NotPicklableError, WorkerFailedError, LaunchTimeoutError,
               JobStoppedError):
    setattr(launch, _error.__name__, _error)


class _CallableModule(types.ModuleType):
    __call__ = staticmethod(launch)


def _import_again(module: types.ModuleType) -> tuple:
    """Pickles this module by name (cloudpickle takes a function that calls `kmp.launch` by
    value, with the submodules it reaches: a function that launches itself from `__main__`)."""
    import importlib

    return importlib.import_module, (module.__name__,)


sys.modules[__name__].__class__ = _CallableModule
copyreg.pickle(_CallableModule, _import_again)


def _pickle_payload(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    from keras_mgpu_plugins.launch import _source

    try:  # with the source of what travels by value, for inspect and AutoGraph
        return _source.dumps((fn, args, kwargs))
    except Exception as err:
        parts = (("fn", fn), ("args", args), ("kwargs", kwargs))
        name, value = next(((n, v) for n, v in parts if not _picklable(v)), ("fn", fn))
        raise NotPicklableError(
            f"{name} must be picklable with cloudpickle to reach the worker processes, but "
            f"pickling failed: {type(err).__name__}: {err}. Everything {name} refers to "
            "(globals, closure variables, default arguments) is pickled too: create locks, "
            "open files, sessions and models inside fn instead. "
            f"Received: {name}={value!r:.300}"
        ) from err


def _picklable(value: Any) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception:
        return False
    return True


from keras_mgpu_plugins.launch._cli import _split_argv, main  # noqa: E402,F401 - the CLI, re-exported
