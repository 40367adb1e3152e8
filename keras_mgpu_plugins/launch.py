"""Local multi-worker runs: `kmp.launch(fn)` and the `kmp-launch` command.

Each worker is a fresh Python process (never a fork) in its own session, with a
`TF_CONFIG` describing a localhost cluster on free ports, the parent's
environment, working directory and (for `launch`) `sys.path`. Its output is
relayed line by line with a `[worker i] ` prefix. Pickled payloads travel
through a private temporary folder (mode 0700), never over the network.

The run fails fast: when a worker raises, exits non-zero or dies, every other
worker, and anything the workers started, is stopped within seconds and the
first failure is raised with the worker's remote traceback. Workers also stop
when the launcher itself dies. POSIX only (process groups).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keras_mgpu_plugins import _worker

#: Variables the launcher sets in each worker; `env` may not override them.
WORKER_ENV_VARS = ("TF_CONFIG", "KMP_LAUNCH_WORKER", "KMP_NUM_WORKERS", "KMP_WORKER_INDEX")

_GRACE_S = 2.0  # between SIGTERM and SIGKILL when stopping workers
_POLL_S = 0.05
_TAIL_LINES = 20
_output_lock = threading.Lock()


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
    """

    def __init__(self, message: str, *, summary: str, worker_index: int, num_workers: int,
                 exitcode: int | None, remote_traceback: str | None = None,
                 remote_exception: BaseException | None = None,
                 other_failures: Mapping[int, int | None] | None = None) -> None:
        super().__init__(message)
        self.summary = summary
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.exitcode = exitcode
        self.signal = _signal_name(exitcode)
        self.remote_traceback = remote_traceback
        self.remote_exception = remote_exception
        self.other_failures = dict(other_failures or {})


class LaunchTimeoutError(LaunchError, TimeoutError):
    """The run outlasted its timeout; every worker was stopped.

    Attributes:
        timeout: The timeout, in seconds.
        running_workers: Indices of the workers still running at expiry.
    """

    def __init__(self, message: str, *, timeout: float, running_workers: Sequence[int]) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.running_workers = list(running_workers)


def launch(fn: Callable[..., Any], num_workers: int = 2, args: Sequence[Any] = (),
           kwargs: Mapping[str, Any] | None = None, timeout: float | None = None, *,
           create_strategy: bool = True, env: Mapping[str, str | None] | None = None) -> list[Any]:
    """Runs `fn(*args, **kwargs)` in `num_workers` fresh local worker processes.

    Each worker gets `TF_CONFIG` for a localhost cluster of `num_workers`
    workers, `KMP_LAUNCH_WORKER=1`, `KMP_NUM_WORKERS` and `KMP_WORKER_INDEX`,
    on top of the parent's environment, working directory and `sys.path`.
    With several workers and `create_strategy=True`, each worker creates its
    `MultiWorkerMirroredStrategy` (`kmp.strategy.get_strategy("multi_worker")`)
    before `fn` is even unpickled, as TensorFlow requires; `kmp.parallelize`
    in `fn` then uses it.

    `fn` travels with cloudpickle: lambdas, closures and functions defined in
    `__main__` or a notebook work; a function from an importable module is sent
    by reference and imported in the worker.

    Args:
        fn: The function each worker calls.
        num_workers: Number of worker processes, at least 1.
        args: Positional arguments for `fn`.
        kwargs: Keyword arguments for `fn`.
        timeout: Seconds the whole run may take, or `None` for no limit.
        create_strategy: Create the multi-worker strategy in each worker
            first. With `False`, the bootstrap imports no TensorFlow.
        env: Variables to set (or, with `None`, unset) in the workers.

    Returns:
        What `fn` returned in each worker, in worker order.

    Raises:
        ValueError: For a bad `num_workers`, `timeout` or `env`.
        TypeError: For a non-callable `fn` or `args`/`kwargs`/`env` of the wrong type.
        NotPicklableError: If `fn`, `args` or `kwargs` cannot be pickled
            (raised before any process starts).
        WorkerFailedError: If a worker fails; the others are stopped.
        LaunchTimeoutError: If the run outlasts `timeout`.

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
    _check_common(num_workers, timeout)
    environ = _worker_environ(env)
    payload = _pickle_payload(fn, tuple(args), dict(kwargs or {}))
    spec = {"mode": "function", "sys_path": list(sys.path),
            "create_strategy": bool(create_strategy)}
    return _run(spec, num_workers, timeout, environ, payload)


# `kmp.launch` may be this function or, once this module was imported by name,
# the module itself (the import system sets it on the package). Either way
# `kmp.launch(fn)` runs and `kmp.launch.WorkerFailedError` names the exception.
for _error in (LaunchError, NotPicklableError, WorkerFailedError, LaunchTimeoutError):
    setattr(launch, _error.__name__, _error)


class _CallableModule(types.ModuleType):
    __call__ = staticmethod(launch)


sys.modules[__name__].__class__ = _CallableModule


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


def _pickle_payload(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps((fn, args, kwargs))
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


def _free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1, released before returning."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            sockets.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sockets[-1].bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    except OSError as err:
        raise LaunchError(f"Could not find {n} free TCP ports on 127.0.0.1 for the workers' "
                          f"TF_CONFIG: {err}. Received: num_workers={n}") from err
    finally:
        for s in sockets:
            s.close()


def _signal_name(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return str(-exitcode)


class _Worker:
    """One worker process: its pipes' relays, outcome files and process group."""

    def __init__(self, index: int, proc: subprocess.Popen, spec_path: str) -> None:
        self.index, self.proc = index, proc
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
        try:
            with open(self.error_path, "rb") as f:
                _, type_name, exc_data, when, text = pickle.load(f)
        except (OSError, pickle.UnpicklingError, ValueError, EOFError):
            return None, None, self.exited_at, None
        try:
            exc = pickle.loads(exc_data) if exc_data is not None else None
        except Exception:  # its class may not exist here: the text says it all
            exc = None
        return type_name, exc, when, text

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


def _run(spec: dict, num_workers: int, timeout: float | None, environ: dict[str, str],
         payload: bytes | None = None) -> list[Any]:
    """Starts the workers, supervises them, stops them all; returns `fn`'s values."""
    tmpdir = tempfile.mkdtemp(prefix="kmp-launch-")  # mode 0700: private to this user
    workers: list[_Worker] = []
    try:
        spec_path = os.path.join(tmpdir, "spec.pkl")
        if payload is not None:
            spec["payload_path"] = os.path.join(tmpdir, "payload.pkl")
            with open(spec["payload_path"], "wb") as f:
                f.write(payload)
        pythonpath = environ.get("PYTHONPATH")
        spec.update(parent_pid=os.getpid(), num_workers=num_workers, pythonpath=pythonpath)
        with open(spec_path, "wb") as f:
            pickle.dump(spec, f)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        environ = {**environ, "KMP_LAUNCH_WORKER": "1", "KMP_NUM_WORKERS": str(num_workers),
                   "PYTHONPATH": os.pathsep.join(filter(None, [package_root, pythonpath]))}
        cluster = {"worker": [f"localhost:{port}" for port in _free_ports(num_workers)]}
        for index in range(num_workers):
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            proc = subprocess.Popen(
                [sys.executable, "-m", "keras_mgpu_plugins._worker", spec_path, str(index)],
                env={**environ, "TF_CONFIG": json.dumps(tf_config), "KMP_WORKER_INDEX": str(index)},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )
            workers.append(_Worker(index, proc, spec_path))
        _supervise(workers, timeout, payload is not None)
        _stop(workers)
        _raise_first_failure(workers, payload is not None)
        return [_result(w) for w in workers] if payload is not None else [None] * num_workers
    finally:
        _stop(workers)
        shutil.rmtree(tmpdir, ignore_errors=True)


def _supervise(workers: list[_Worker], timeout: float | None, expects_result: bool) -> None:
    """Waits until every worker is done, one fails, or the timeout expires."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done = [w.check_exit() for w in workers]
        failing = [w for w in workers if w.failed(expects_result)]
        if failing:  # a worker that reported an error is exiting: let it finish
            grace_end = time.monotonic() + _GRACE_S / 2
            for w in failing:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(max(0.0, grace_end - time.monotonic()))
                w.check_exit()
            return
        if all(done):
            return
        if deadline is not None and time.monotonic() >= deadline:
            running = [w.index for w, d in zip(workers, done, strict=True) if not d]
            _stop(workers)
            raise LaunchTimeoutError(
                f"The run did not finish within timeout={timeout!r} seconds; workers "
                f"{running} were still running. All workers were stopped.",
                timeout=timeout, running_workers=running,
            )
        time.sleep(_POLL_S)


def _stop(workers: list[_Worker]) -> None:
    """SIGTERM, then after a grace period SIGKILL, every worker's process tree."""
    for w in workers:
        w.check_exit()  # an exit seen now is the worker's own, not the launcher's doing
    live = [w for w in workers if w.group_alive()]
    for w in live:
        w.kill_tree(signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while live and time.monotonic() < deadline and any(w.group_alive() for w in live):
        time.sleep(_POLL_S)
    for w in live:
        if w.group_alive():  # an emptied group's id may be reused: never signal it
            w.kill_tree(signal.SIGKILL)
    for w in workers:
        w.proc.wait()
    deadline = time.monotonic() + _GRACE_S
    for w in workers:
        for relay in w.relays:  # let the last lines out; never hang on an escaped pipe
            relay.join(max(0.0, deadline - time.monotonic()))


def _raise_first_failure(workers: list[_Worker], expects_result: bool) -> None:
    failures = []
    for w in workers:
        if w.failed(expects_result):
            raised, exc, when, text = w.error_record()
            failures.append((when if when is not None else time.time(), w, raised, exc, text))
        elif expects_result and w.proc.returncode != 0 and os.path.exists(w.result_path):
            warnings.warn(f"Worker {w.index} returned its result, then ended with "
                          f"{_describe_exit(w.proc.returncode)} while shutting down.",
                          RuntimeWarning, stacklevel=4)
    if not failures:
        return
    failures.sort(key=lambda f: f[0])
    _, first, raised, exc, text = failures[0]
    others = {w.index: w.proc.returncode for _, w, _, _, _ in failures[1:]}
    summary = f"worker {first.index} of {len(workers)} {_how(first, raised, text, expects_result)}."
    if others:
        summary += " Also failed: " + ", ".join(
            f"worker {w.index} {_how(w, r, t, expects_result)}"
            for _, w, r, _, t in failures[1:]) + "."
    if len(failures) < len(workers):
        summary += " The other workers were stopped."
    if text is not None:
        detail = f"Remote traceback of worker {first.index}:\n{text.rstrip()}"
    elif first.stderr_tail:
        detail = f"Last lines of worker {first.index}'s stderr:\n" + "\n".join(first.stderr_tail)
    else:
        detail = f"Worker {first.index} printed nothing to stderr."
    raise WorkerFailedError(
        f"{summary[0].upper()}{summary[1:]}\n\n{detail}", summary=summary,
        worker_index=first.index, num_workers=len(workers), exitcode=first.proc.returncode,
        remote_traceback=text, remote_exception=exc, other_failures=others,
    )


def _how(w: _Worker, raised: str | None, text: str | None, expects_result: bool) -> str:
    """How worker `w` failed, e.g. "raised ValueError (exit code 1)"."""
    code = w.proc.returncode
    if raised is not None and raised != "SystemExit":
        return f"raised {raised} (exit code {code})"
    if code is not None and code < 0:
        return f"was killed by {_describe_exit(code)}"
    if text is None and expects_result and code == 0:
        return "exited with code 0 before fn returned"
    return f"exited with code {code}"


def _describe_exit(code: int | None) -> str:
    name = _signal_name(code)
    return f"signal {name} (exit code {code})" if name else f"exit code {code}"


def _result(w: _Worker) -> Any:
    try:
        with open(w.result_path, "rb") as f:
            return pickle.load(f)
    except Exception as err:
        raise LaunchError(f"The value worker {w.index} returned cannot be unpickled in the "
                          f"parent: {type(err).__name__}: {err}") from err


_CLI_DESCRIPTION = """\
Run a Python script (or module) in N local worker processes, as a TensorFlow
multi-worker job on localhost.

Each worker runs `script.py args...` as __main__, with TF_CONFIG describing a
cluster of N workers on free localhost ports and this one's index, plus
KMP_LAUNCH_WORKER=1, KMP_NUM_WORKERS=N and KMP_WORKER_INDEX=i. Unless
--no-strategy is given, each worker creates its MultiWorkerMirroredStrategy
before the script starts (TensorFlow needs collective ops configured before
its runtime starts); kmp.parallelize, or a MultiWorkerMirroredStrategy the
script creates itself, then uses it. Output lines are prefixed with
"[worker i] ".

Fail-fast: when a worker exits non-zero or dies, the others (and every process
they started) are stopped within seconds. The exit code is 0 when every worker
succeeds, else the first failing worker's exit code (128+N if it was killed by
signal N), 124 when --timeout expires, and 130 on Ctrl-C."""

_CLI_EPILOG = """\
examples:
  kmp-launch -n 2 train.py --epochs 3
  kmp-launch -n 4 --timeout 600 -m mypackage.train --epochs 3
  python -m keras_mgpu_plugins.launch -n 2 --no-strategy script.py a b"""

_VALUE_OPTIONS = ("-n", "--num-workers", "--timeout")


def _positive(kind: type, flag: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            what = "integer" if kind is int else "number"
            raise argparse.ArgumentTypeError(f"must be a positive {what}. Received: {flag}={text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kmp-launch", description=_CLI_DESCRIPTION, epilog=_CLI_EPILOG,
        usage="kmp-launch [-n N] [--timeout SECONDS] [--no-strategy] "
              "(script.py | -m module) [args ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", "--num-workers", type=_positive(int, "-n"), default=2, metavar="N",
                        help="number of worker processes (default: 2)")
    parser.add_argument("--timeout", type=_positive(float, "--timeout"), metavar="SECONDS",
                        help="stop every worker and exit with code 124 after this many seconds")
    parser.add_argument("--no-strategy", action="store_true",
                        help="do not create the multi-worker strategy before the script starts")
    parser.add_argument("-m", dest="module", metavar="module",
                        help="run a module as a script (as `python -m module`)")
    parser.add_argument("script", nargs="?", help="the script each worker runs")
    parser.add_argument("args", nargs="*", help="arguments passed to the script or module")
    return parser


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Splits the launcher's options from the script's: the script (or `-m module`) ends them."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" or arg == "--":
            return list(argv[: i + 2]), list(argv[i + 2:])
        if arg.startswith("-m"):  # -mmodule
            return list(argv[: i + 1]), list(argv[i + 1:])
        if not arg.startswith("-") or arg == "-":
            return list(argv[: i + 1]), list(argv[i + 1:])
        i += 2 if arg in _VALUE_OPTIONS else 1
    return list(argv), []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `kmp-launch` and `python -m keras_mgpu_plugins.launch`.

    Args:
        argv: Command-line arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        The process exit code (see `kmp-launch --help`).
    """
    own, rest = _split_argv(list(sys.argv[1:] if argv is None else argv))
    parser = _parser()
    try:
        options = parser.parse_args(own)
        if (options.script is None) == (options.module is None):
            parser.error("give exactly one of a script or -m module. "
                         f"Received: script={options.script!r}, -m={options.module!r}")
    except SystemExit as exit_:  # --help, or a usage error argparse already printed
        return exit_.code if isinstance(exit_.code, int) else 0
    if options.script is not None and not os.path.isfile(options.script):
        print(f"kmp-launch: can't open file {options.script!r}: no such file. "
              f"Received: script={options.script!r}", file=sys.stderr)
        return 2
    spec = {"mode": "script" if options.module is None else "module",
            "target": options.script or options.module, "argv": [*options.args, *rest],
            "create_strategy": not options.no_strategy}
    try:
        _check_common(options.num_workers, options.timeout)
        _run(spec, options.num_workers, options.timeout, _worker_environ(None))
    except WorkerFailedError as err:
        print(f"kmp-launch: {err.summary}", file=sys.stderr)
        code = err.exitcode or 1
        return 128 - code if code < 0 else code
    except LaunchTimeoutError as err:
        print(f"kmp-launch: {err}", file=sys.stderr)
        return 124
    except LaunchError as err:
        print(f"kmp-launch: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kmp-launch: interrupted; all workers were stopped.", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
