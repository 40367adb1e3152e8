"""Bootstrap of one `kmp.launch` / `kmp-launch` worker process.

Started by the launcher as ``python -m keras_mgpu_plugins.launch._worker SPEC INDEX``,
in its own session, with `TF_CONFIG` already in its environment. In order, it:

1. watches its parent and, if the parent dies, kills its own process group
   (itself and anything it started), so a dead launcher leaves no orphans; the
   same thread answers the launcher's request for this worker's Python stacks
   when the run's timeout expires (`launch._stacks`);
2. reads the launch spec (plain pickle of built-in types: no user module is
   imported yet) and sets `sys.path` / `sys.argv` as the parent asks;
3. creates the multi-worker strategy when the job has several workers and the
   launcher asks for it: TensorFlow requires collective ops to be configured
   before its runtime starts, i.e. before any user code can run an op;
   then, unless the launcher was told otherwise, makes every `fit` get a
   `StallWatchdog` once Keras is imported;
4. runs the user's code (a cloudpickled function, a script or a module) and
   writes the outcome to a private file beside the spec: the function's value,
   or the exception with its traceback text and the time it happened.

Nothing here imports TensorFlow unless step 3 applies.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time

from keras_mgpu_plugins import _stop_signals
from keras_mgpu_plugins.errors import TrainingStopped
from keras_mgpu_plugins.io import atomic  # the package's one atomic writer (no backend)
from keras_mgpu_plugins.launch import _stacks
from keras_mgpu_plugins.launch._exit import _exit_after_failure, _user_traceback

#: Seconds between two checks that the launcher is still alive.
PARENT_POLL_INTERVAL = 0.5

_LOAD_HINT = (
    "kmp.launch could not load fn in this worker. Functions and classes are sent by "
    "reference to their module when it is importable, so that module must be importable "
    "from the parent's sys.path; otherwise define them in __main__ or register the "
    "module with cloudpickle.register_pickle_by_value(module)."
)


def outcome_path(spec_path: str, index: int, kind: str) -> str:
    """Where worker `index` writes its outcome of `kind` (`"result"` or `"error"`).

    The kind is in the name so the launcher sees a failure without unpickling.
    """
    return os.path.join(os.path.dirname(spec_path), f"{kind}-{index}.pkl")


def main(argv: list[str] | None = None) -> int:
    """Runs one worker. Returns its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[1].isdigit():
        print(f"usage: python -m keras_mgpu_plugins.launch._worker SPEC INDEX. Received: {argv}",
              file=sys.stderr)
        return 2
    spec_path, index = argv[0], int(argv[1])
    # A stop signal from now on ends this worker cleanly (`_stop_signals`); set again once
    # the backend's runtime started (it installs a SIGTERM notifier of its own).
    _stop_signals.install(_stop_signals.parse(_stop_signals.DEFAULT_SIGNALS))
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    _watch_parent(spec["parent_pid"], os.environ.get("KMP_JOB_DIR"), index)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # lines reach the launcher as they are printed
            stream.reconfigure(line_buffering=True)
    _restore_env("PYTHONPATH", spec["pythonpath"])
    if spec.get("cwd"):  # kmp-verify: each run works in a folder of its own
        os.chdir(spec["cwd"])
    errors = outcome_path(spec_path, index, "error")
    try:
        if spec["mode"] == "function":
            sys.path[:] = spec["sys_path"]
            return _run_function(spec, outcome_path(spec_path, index, "result"), errors)
        return _run_program(spec, errors)
    except TrainingStopped as stopped:  # a stop signal (`_stop_signals`), wherever it came
        atomic.write_bytes_atomic(outcome_path(spec_path, index, "stopped"),
                                  pickle.dumps(stopped.record()))
        return int(stopped.code)


def _run_function(spec: dict, out: str, errors: str) -> int:
    stage = "strategy"
    try:
        _maybe_create_strategy(spec)
        stage = "load"
        from keras_mgpu_plugins.launch import _source

        with open(spec["payload_path"], "rb") as f:
            fn, args, kwargs = _source.loads(f.read())  # the source into linecache first
        stage = "run"
        value = fn(*args, **kwargs)
    except TrainingStopped:
        raise  # reported by `main`
    except SystemExit as exit_:
        _write_error(errors, exit_, f"fn called sys.exit({exit_.code!r}) instead of returning.")
        return _exit_code(exit_)
    except BaseException as err:  # noqa: B036 - every failure is reported to the parent
        _write_error(errors, err, _LOAD_HINT if stage == "load" else None)
        return 1
    try:
        import cloudpickle

        data = cloudpickle.dumps(value)
    except Exception as err:
        note = f"fn returned a {type(value).__qualname__}, which cannot be pickled back."
        _write_error(errors, err, note)
        return 1
    atomic.write_bytes_atomic(out, data)
    return 0


def _run_program(spec: dict, out: str) -> int:
    # The same code as `python -m keras_mgpu_plugins.run` under a scheduler.
    from keras_mgpu_plugins.run import run_program

    try:
        _maybe_create_strategy(spec)
        run_program(spec["target"], spec["argv"], module=spec["mode"] == "module")
    except SystemExit:
        raise
    except BaseException as err:  # noqa: B036 - printed like Python does, then reported
        text = _user_traceback(err)
        print(text, end="", file=sys.stderr)
        _write_error(out, err, None, text)
        return 1
    return 0


def _maybe_create_strategy(spec: dict) -> None:
    # Before any user code, because TensorFlow can configure collective ops only
    # before its runtime starts; then the launcher's StallWatchdog.
    from keras_mgpu_plugins.run import prepare

    prepare(create_strategy=spec["create_strategy"] and spec["num_workers"] > 1,
            stall_timeout=spec.get("stall_timeout"))


def _write_error(out: str, err: BaseException, note: str | None, text: str | None = None) -> None:
    text = text or _user_traceback(err)
    if note:
        text = f"{text.rstrip()}\n\n{note}\n"
    try:  # pickled apart, so the text still travels if the exception cannot
        import cloudpickle

        exc_data = cloudpickle.dumps(err)
    except Exception:
        exc_data = None
    try:
        record = ("error", type(err).__name__, exc_data, time.time(), text)
        atomic.write_bytes_atomic(out, pickle.dumps(record))
    except OSError:
        print(text, file=sys.stderr)


def read_error(path: str) -> tuple[str, BaseException | None, float, str] | None:
    """Reads what `_write_error` wrote: exception type name, exception, wall time, text.

    Returns `None` without a readable record. The exception is `None` when it cannot
    be unpickled (its class may not exist in the launcher): the text says it all.
    """
    try:
        with open(path, "rb") as f:
            _, type_name, exc_data, when, text = pickle.load(f)
    except (OSError, pickle.UnpicklingError, ValueError, EOFError):
        return None
    try:
        exc = pickle.loads(exc_data) if exc_data is not None else None
    except Exception:
        exc = None
    return type_name, exc, when, text


def _exit_code(exit_: SystemExit) -> int:
    if exit_.code is None:
        return 0
    return exit_.code if isinstance(exit_.code, int) else 1


def _restore_env(name: str, value: str | None) -> None:
    """Gives user code the parent's value of `name` (the launcher may extend it)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _watch_parent(parent_pid: int, job_dir: str | None = None, index: int = 0) -> None:
    def watch() -> None:
        answered = job_dir is None
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_INTERVAL)
            if not answered:  # the run's timeout expired: the launcher asks for our stacks
                try:
                    answered = _stacks.answer_if_asked(job_dir, index)
                except Exception as err:  # noqa: BLE001 - this thread must go on watching
                    answered = True
                    print(f"kmp.launch: worker {index} could not write its stacks: {err}",
                          file=sys.stderr)
        if os.getpgrp() == os.getpid():  # we lead our group: take our children with us
            os.killpg(os.getpid(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="kmp-parent-watchdog", daemon=True).start()


if __name__ == "__main__":
    exit_code = main()
    if exit_code != 0:
        _exit_after_failure(exit_code)
    sys.exit(exit_code)
