"""Process handling behind `kmp.launch` and `kmp-launch`.

Starts the workers (fresh interpreters running `keras_mgpu_plugins.launch._worker`, each
in its own session with its `TF_CONFIG`), waits for them, stops every process
group, and turns the first failure into a `WorkerFailedError`. Each worker's
output goes to its log file, `<log_dir>/worker-<i>.log` (`output_paths`); the
chief's, or with `output="all"` every worker's, is also relayed here with a
`[worker i] ` prefix. One worker process as the launcher sees it (its relays,
its outcome files, its process group) is `_process._Worker`.
Pickled payloads travel through a private temporary folder (mode 0700), never
over the network.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from keras_mgpu_plugins import _stop_signals
from keras_mgpu_plugins.launch import _signals, _stacks, _tasks
from keras_mgpu_plugins.launch._errors import (
    LaunchError,
    LaunchTimeoutError,
    named,
)
from keras_mgpu_plugins.launch._failures import _raise_first_failure
from keras_mgpu_plugins.launch._process import _Worker, output_paths, tell_where_output_goes
from keras_mgpu_plugins.launch._tuning import (
    MIN_PARAMETER_SERVER_INTEROP,
    threads_line,
    worker_tuning,
)

_GRACE_S = 2.0  # between SIGTERM and SIGKILL when stopping workers
_POLL_S = 0.05
_DRAIN_S = 10.0  # for the relays to pass on what the stopped workers wrote last
_STACKS_S = 10.0  # for the workers still running at the timeout to print their stacks


def run(spec: dict, num_workers: int, timeout: float | None, environ: dict[str, str],
        payload: bytes | None = None, output: str = "chief",
        log_dir: str | None = None, stop_grace: float = _signals.DEFAULT_STOP_GRACE_S) -> list[Any]:
    """Starts the workers, supervises them, stops them all; returns `fn`'s values.

    Whatever the ending (success, a failed worker, the timeout, Ctrl-C, a stop
    signal), every worker is stopped and the job's private folder (spec,
    payload, job folder) is removed before this returns or raises.

    Args:
        spec: The launch spec the workers read (`_worker.main`), completed here.
        num_workers: Number of workers.
        timeout: Seconds the run may take, or `None`.
        environ: The workers' environment, before the launcher's variables.
        payload: Cloudpickled `(fn, args, kwargs)`, or `None` to run a program.
        output: `"chief"` (only worker 0's output is relayed here, without the backends'
            runtime log lines: `launch._quiet`), `"verbose"` (worker 0's, all of it),
            `"all"` (every worker's, all of it) or `"none"` (the log files only: kmp-verify's
            runs, which run side by side).
        log_dir: Folder of the workers' log files (default: `output_paths`).
        stop_grace: Seconds the workers get after a stop signal (`launch._signals`).

    Returns:
        Each worker's value (`None` each for a program), in worker order.

    Raises:
        JobStoppedError: When a stop signal stopped the job (see `launch._signals`).
    """
    workers: list[_Worker] = []
    with _signals.caught() as caught:
        tmpdir = None
        try:
            tmpdir = tempfile.mkdtemp(prefix="kmp-launch-")  # mode 0700: private to this user
            results = _run(spec, num_workers, timeout, environ, payload, tmpdir, workers,
                           caught, output, log_dir, stop_grace)
        finally:
            _stop(workers)
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
        if caught is not None and caught.interrupted.is_set():  # Ctrl-C after the workers ended
            raise KeyboardInterrupt
        return results


def _run(spec: dict, num_workers: int, timeout: float | None, environ: dict[str, str],
         payload: bytes | None, tmpdir: str, workers: list[_Worker],
         caught: _signals.Caught | None, output: str = "chief",
         log_dir: str | None = None, stop_grace: float = _signals.DEFAULT_STOP_GRACE_S) -> list[Any]:
    """The body of `run`: write the spec, start the workers, supervise them."""
    spec_path = os.path.join(tmpdir, "spec.pkl")
    if payload is not None:
        spec["payload_path"] = os.path.join(tmpdir, "payload.pkl")
        with open(spec["payload_path"], "wb") as f:
            f.write(payload)
    pythonpath = environ.get("PYTHONPATH")
    spec.update(parent_pid=os.getpid(), num_workers=num_workers, pythonpath=pythonpath)
    with open(spec_path, "wb") as f:
        pickle.dump(spec, f)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # One id per job, shared by every worker (e.g. a W&B group); kept if already set.
    job_id = environ.get("KMP_JOB_ID") or uuid.uuid4().hex[:12]
    job_dir = os.path.join(tmpdir, "job")  # shared by the workers (e.g. StallWatchdog)
    os.mkdir(job_dir)
    tasks = _tasks.layout(num_workers, spec.get("num_ps", 0))
    tuning = worker_tuning(environ, len(tasks), min_interop=(
        MIN_PARAMETER_SERVER_INTEROP if spec.get("num_ps") else 1))
    program = "kmp.launch" if payload is not None else "kmp-launch"
    said = threads_line(program, environ, tuning, len(tasks))
    if said:
        print(said, file=sys.stderr, flush=True)
    environ = {**environ, **tuning,
               "KMP_LAUNCH_WORKER": "1", "KMP_NUM_WORKERS": str(num_workers),
               "KMP_JOB_ID": job_id, "KMP_JOB_DIR": job_dir,
               _stop_signals.STOP_GRACE_ENV: f"{stop_grace:g}",
               "PYTHONPATH": os.pathsep.join(filter(None, [package_root, pythonpath]))}
    if output == "all":  # every worker's fit/evaluate/predict shows its progress bar
        environ["KMP_OUTPUT"] = "all"
    log_dir = output_paths(log_dir, job_id)
    tell_where_output_goes(spec, num_workers, output, log_dir)
    cluster = _tasks.cluster(tasks, free_ports(len(tasks)))

    def start(index: int) -> _Worker:
        task = tasks[index]
        tf_config = {"cluster": cluster, "task": {"type": task.task_type,
                                                  "index": task.task_index}}
        proc = subprocess.Popen(
            [sys.executable, "-m", "keras_mgpu_plugins.launch._worker", spec_path, str(index)],
            env={**environ, "TF_CONFIG": json.dumps(tf_config), "KMP_WORKER_INDEX": str(index)},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        return _Worker(index, proc, spec_path, job_dir, os.path.join(log_dir, task.log_name),
                       shown=output == "all" or (index == 0 and output != "none"),
                       label=task.label,
                       serves=task.serves, quiet=output == "chief" and len(tasks) > 1)

    workers.extend(start(index) for index in range(len(tasks)))
    restarts = _tasks.Restarts(tasks, start) if spec.get("num_ps") else None
    try:
        forwarded = _supervise(workers, timeout, payload is not None, caught, job_dir,
                               stop_grace, restarts)
    finally:
        if restarts is not None:
            _stop(restarts.lost)
    _stop(workers)
    _raise_first_failure(workers, payload is not None)
    stopped = _signals.stopped_error(workers, forwarded,
                                     "kmp.launch" if payload is not None else "kmp-launch")
    if stopped is not None:
        raise stopped
    users = [w for w in workers if not w.serves]  # the chief alone under parameter servers
    return [w.result() for w in users] if payload is not None else [None] * len(users)


def free_ports(n: int) -> list[int]:
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


def _supervise(workers: list[_Worker], timeout: float | None, expects_result: bool,
               caught: _signals.Caught | None = None, job_dir: str | None = None,
               stop_grace: float = _signals.DEFAULT_STOP_GRACE_S,
               restarts: _tasks.Restarts | None = None) -> int | None:
    """Waits until every worker is done, one fails, the timeout expires, Ctrl-C, or a stop.

    A stop signal the launcher receives is forwarded to every worker (`launch._signals`);
    a worker that stops (after its own signal too) gives the others `stop_grace` seconds
    to stop at the same step.

    Returns:
        The stop signal forwarded to the workers, if any.

    Under parameter servers the job is done when the chief is (the servers are then
    stopped), and a worker that exits is started again (`restarts`).

    Raises:
        KeyboardInterrupt: On Ctrl-C (the caller stops the workers).
        LaunchTimeoutError: When the timeout expires (the workers still running are
            asked for their stacks through `job_dir`, then every worker is stopped).
        JobStoppedError: On a second stop signal, or when workers did not stop within
            `stop_grace` (every worker is stopped first).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    forwarded: int | None = None
    stop_end: float | None = None
    while True:
        if caught is not None and caught.interrupted.is_set():
            raise KeyboardInterrupt
        signum = caught.take_stop() if caught is not None else None
        if signum is not None and forwarded is None:
            forwarded, stop_end = signum, time.monotonic() + stop_grace
            _signals.forward(workers, signum, stop_grace,
                             "kmp.launch" if expects_result else "kmp-launch", job_dir)
        elif signum is not None:  # a second one: stop now
            _stop(workers)
            raise _signals.again_error(signum, forwarded)
        done = [w.check_exit() for w in workers]
        if restarts is not None:
            restarts.replace(workers)
            done = [w.check_exit() for w in workers]
        failing = [w for w in workers if w.failed(expects_result)]
        if failing:  # a worker that reported an error is exiting: let it finish
            grace_end = time.monotonic() + _GRACE_S / 2
            for w in failing:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(max(0.0, grace_end - time.monotonic()))
                w.check_exit()
            return forwarded
        if all(d for w, d in zip(workers, done, strict=True) if not w.serves):
            return forwarded
        stopped = [w for w in workers if w.stopped()]
        if stop_end is None and stopped:  # stopped by its own signal: the others follow
            saving = any(w.stopped_record().get("saved") for w in stopped)
            stop_end = time.monotonic() + (stop_grace if saving else _GRACE_S)
        if stop_end is not None and time.monotonic() >= stop_end:
            if forwarded is None and not any(w.stopped_record().get("saved") for w in stopped):
                return forwarded  # nothing saved anywhere: stop the rest (`stopped_error` says)
            _stop(workers)
            raise _signals.late_error([w.index for w, d in zip(workers, done, strict=True)
                                       if not d and not w.serves], forwarded, stop_grace)
        if deadline is not None and time.monotonic() >= deadline:
            _time_out(workers, [w.index for w, d in zip(workers, done, strict=True)
                                if not d and not w.serves], timeout, job_dir)
        time.sleep(_POLL_S)


def _time_out(workers: list[_Worker], running: list[int], timeout: float,
              job_dir: str | None) -> None:
    """Asks the workers still running where they are, stops every worker, and raises.

    Raises:
        LaunchTimeoutError: Naming the workers still running, where each was, with their
            Python stacks.
    """
    answers = _stacks.ask(job_dir, running, _STACKS_S) if job_dir else {}
    _stop(workers)
    finished = [w.index for w in workers if w.index not in running and not w.serves]
    labels = {w.index: w.label for w in workers}
    message = (f"The run did not finish within timeout={timeout!r} seconds: "
               f"{_named(running, labels)} of {len(workers)} had not finished"
               + (f" ({_named(finished, labels)} had)" if finished else "")
               + ". All workers were stopped.")
    if answers:
        message += "\n" + _stacks.describe(answers, len(workers), _STACKS_S)
    raise LaunchTimeoutError(
        message, timeout=timeout, running_workers=running,
        stacks={i: a and a["stacks"] for i, a in answers.items()})


def _named(indices: list[int], labels: dict[int, str] | None = None) -> str:
    """`"worker 1"`, `"workers 0, 1"`; `"chief"` under parameter servers (`labels`)."""
    if labels and any(labels[i] != f"worker {i}" for i in indices):
        return ", ".join(labels[i] for i in indices)
    return named(indices)


def _stop(workers: list[_Worker]) -> None:
    """SIGTERM, then after a grace period SIGKILL, every worker's process tree.

    First `_stop_signals.HARD_STOP` in the job folder: this SIGTERM is no stop request,
    a worker ends as its default action would, nothing saved.
    """
    for w in workers:
        w.check_exit()  # an exit seen now is the worker's own, not the launcher's doing
    live = [w for w in workers if w.group_alive()]
    if live:
        with contextlib.suppress(OSError):
            with open(os.path.join(live[0].job_dir, _stop_signals.HARD_STOP), "w"):
                pass
    for w in live:
        w.stopped_by_launcher = True
        w.kill_tree(signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while live and time.monotonic() < deadline and any(w.group_alive() for w in live):
        time.sleep(_POLL_S)
    for w in live:
        if w.group_alive():  # an emptied group's id may be reused: never signal it
            w.kill_tree(signal.SIGKILL)
    for w in workers:
        w.proc.wait()
    deadline = time.monotonic() + _DRAIN_S
    for w in workers:
        for relay in w.relays:  # let the last lines out; never hang on an escaped pipe
            relay.join(max(0.0, deadline - time.monotonic()))
