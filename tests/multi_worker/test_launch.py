"""`kmp.launch`: real worker processes on localhost.

Most tests pass `create_strategy=False` so workers do not import TensorFlow (fast);
one slow test checks that each worker's multi-worker strategy exists before `fn` runs.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import psutil
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.launch import LaunchTimeoutError, NotPicklableError, WorkerFailedError

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(120)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _launch(fn, num_workers=2, **kwargs):
    return kmp.launch(fn, num_workers, create_strategy=False, **kwargs)


def _gone(pid: int) -> bool:
    """The process no longer runs (a zombie awaiting its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _pids(pid_dir: pathlib.Path, prefix="worker") -> dict[str, int]:
    return {p.name: int(p.read_text()) for p in pid_dir.glob(f"{prefix}-*")}


def _write_pid(pid_dir: pathlib.Path, name: str, pid: int) -> None:
    tmp = pid_dir / f".{name}.tmp"
    tmp.write_text(str(pid))
    os.replace(tmp, pid_dir / name)


# Functions the workers run (module level: sent by reference, imported by the worker).


def _whoami():
    main = sys.modules["__main__"]
    return {
        "task_index": json.loads(os.environ["TF_CONFIG"])["task"]["index"],
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "main": main.__spec__.name if main.__spec__ else None,
    }


def _square(x):
    return x * x


def _tf_config_and_env():
    return json.loads(os.environ["TF_CONFIG"]), {
        k: os.environ.get(k) for k in ("KMP_LAUNCH_WORKER", "KMP_NUM_WORKERS", "KMP_WORKER_INDEX")
    }


def _report(a, b, *, c):
    return {
        "args": (a, b, c),
        "parent_var": os.environ.get("KMP_TEST_PARENT_VAR"),
        "override": os.environ.get("KMP_TEST_OVERRIDE"),
        "unset": os.environ.get("KMP_TEST_UNSET_ME"),
        "cwd": os.getcwd(),
        "pythonpath": os.environ.get("PYTHONPATH"),
    }


def _payload_folder():
    spec_path = sys.argv[1]  # the bootstrap's: python -m keras_mgpu_plugins.launch._worker SPEC INDEX
    folder = os.path.dirname(spec_path)
    return folder, os.stat(folder).st_mode & 0o777, sorted(os.listdir(folder))


def _loaded_frameworks():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras"))


def _chatty():
    index = os.environ["KMP_WORKER_INDEX"]
    print(f"hello from {index}")
    print(f"to stderr {index}", file=sys.stderr)
    return index


def _fail_on_worker_1(action: str, pid_dir: str, grandchild: bool = False):
    """Worker 1 fails by `action` once every worker wrote its pid; the others sleep."""
    pid_dir = pathlib.Path(pid_dir)
    index, count = int(os.environ["KMP_WORKER_INDEX"]), int(os.environ["KMP_NUM_WORKERS"])
    if grandchild and index == 0:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        _write_pid(pid_dir, "grandchild-0", child.pid)
    _write_pid(pid_dir, f"worker-{index}", os.getpid())
    if index != 1:
        time.sleep(60)
        _write_pid(pid_dir, f"slept-{index}", os.getpid())  # reached only if never stopped
        return "slept"
    while len(_pids(pid_dir)) < count:
        time.sleep(0.02)
    if action == "raise":
        raise ValueError("boom from worker 1")
    if action == "print-raise":
        print("worker 1 about to fail", flush=True)
        raise ValueError("boom from worker 1")
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action.startswith("exit"):
        sys.exit(int(action[4:]))
    if action == "unpicklable_result":
        return threading.Lock()
    raise AssertionError(action)


def _both_fail(pid_dir: str):
    """Worker 1 raises first; worker 0 raises once it got the SIGTERM (ignored), in the grace."""
    pid_dir = pathlib.Path(pid_dir)
    index = int(os.environ["KMP_WORKER_INDEX"])
    stopped = []
    if index == 0:  # deaf to SIGTERM, but notes it: worker 1's failure was seen by then
        signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    _write_pid(pid_dir, f"worker-{index}", os.getpid())
    while len(_pids(pid_dir)) < 2:
        time.sleep(0.02)
    if index == 0:
        assert _wait_until(lambda: stopped, timeout=60), "the supervisor sent no SIGTERM"
    raise ValueError(f"failure of worker {index}")


def _sleep_and_record(pid_dir: str):
    _write_pid(pathlib.Path(pid_dir), f"worker-{os.environ['KMP_WORKER_INDEX']}", os.getpid())
    time.sleep(60)
    _write_pid(pathlib.Path(pid_dir), f"slept-{os.environ['KMP_WORKER_INDEX']}", os.getpid())


def _stopped_before_their_sleep_ended(pid_dir: pathlib.Path) -> bool:
    """The sleeping workers were stopped, not left to finish (no wall-clock bound needed)."""
    return not list(pid_dir.glob("slept-*"))


# Tests.


def test_results_come_back_in_worker_order_from_fresh_processes():
    results = _launch(_whoami, 3)
    assert [r["task_index"] for r in results] == [0, 1, 2]
    pids = [r["pid"] for r in results]
    assert len(set(pids)) == 3 and os.getpid() not in pids
    assert [r["ppid"] for r in results] == [os.getpid()] * 3
    assert [r["main"] for r in results] == ["keras_mgpu_plugins.launch._worker"] * 3  # not a fork


def test_lambda_closure_and_module_function_run():
    offset = 10

    def add_offset(x):
        return x + offset

    assert _launch(lambda: 41 + 1) == [42, 42]
    assert _launch(add_offset, args=(5,)) == [15, 15]
    assert _launch(_square, args=[4]) == [16, 16]


def test_tf_config_is_a_localhost_cluster_on_distinct_ports():
    results = _launch(_tf_config_and_env, 3)
    clusters = [config["cluster"] for config, _ in results]
    assert clusters[0] == clusters[1] == clusters[2]
    assert list(clusters[0]) == ["worker"]
    hosts, ports = zip(*(a.split(":") for a in clusters[0]["worker"]), strict=True)
    assert hosts == ("localhost",) * 3
    assert len({int(p) for p in ports}) == 3 and all(0 < int(p) < 65536 for p in ports)
    assert [config["task"] for config, _ in results] == [
        {"type": "worker", "index": i} for i in range(3)
    ]
    assert [env for _, env in results] == [
        {"KMP_LAUNCH_WORKER": "1", "KMP_NUM_WORKERS": "3", "KMP_WORKER_INDEX": str(i)}
        for i in range(3)
    ]


def test_workers_see_parent_env_cwd_and_the_given_args(tmp_path, monkeypatch):
    monkeypatch.setenv("KMP_TEST_PARENT_VAR", "from-parent")
    monkeypatch.setenv("KMP_TEST_UNSET_ME", "set")
    monkeypatch.chdir(tmp_path)
    results = _launch(
        _report, args=(1, [2, 3]), kwargs={"c": {"k": "v"}},
        env={"KMP_TEST_OVERRIDE": "override", "KMP_TEST_UNSET_ME": None},
    )
    for r in results:
        assert r["args"] == (1, [2, 3], {"k": "v"})
        assert r["parent_var"] == "from-parent"
        assert r["override"] == "override"
        assert r["unset"] is None
        assert r["cwd"] == str(tmp_path)
        assert r["pythonpath"] == os.environ.get("PYTHONPATH")  # as the parent's, for user code


def test_modules_importable_through_the_parents_sys_path(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "kmp_launch_helper_mod.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(lib))
    import kmp_launch_helper_mod

    assert _launch(kmp_launch_helper_mod.triple, args=(3,)) == [9, 9]


def test_payloads_travel_through_a_private_folder_removed_afterwards(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    results = _launch(_payload_folder)
    folder, mode, files = results[0]
    assert results[1][:2] == (folder, 0o700)
    assert os.path.dirname(folder) == str(tmp_path)
    assert {"spec.pkl", "payload.pkl"} <= set(files)
    assert not os.path.exists(folder) and os.listdir(tmp_path) == ["kmp-launch-logs"]  # kept


def test_without_strategy_the_bootstrap_imports_no_tensorflow():
    assert _launch(_loaded_frameworks) == [[], []]


def test_output_all_relays_every_workers_output_with_a_worker_prefix(capsys, tmp_path):
    assert _launch(_chatty, output="all", log_dir=str(tmp_path)) == ["0", "1"]
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["[worker 0] hello from 0", "[worker 1] hello from 1"]
    threads, *lines = err.splitlines()  # what it set for the workers' threads (test_launch_tuning)
    assert threads.startswith("kmp.launch: threads of each of 2 workers on ")
    assert sorted(lines) == ["[worker 0] to stderr 0", "[worker 1] to stderr 1"]
    assert (tmp_path / "worker-1.log").read_text() in ("hello from 1\nto stderr 1\n",
                                                       "to stderr 1\nhello from 1\n")


def test_by_default_only_the_chiefs_output_is_shown_the_others_go_to_their_log(capsys, tmp_path):
    assert _launch(_chatty, num_workers=3, log_dir=str(tmp_path / "logs")) == ["0", "1", "2"]
    out, err = capsys.readouterr()
    assert out.splitlines() == ["[worker 0] hello from 0"]
    logs = tmp_path / "logs"
    threads, *lines = err.splitlines()  # what it set for the workers' threads (test_launch_tuning)
    assert threads.startswith("kmp.launch: threads of each of 3 workers on ")
    assert lines == [
        f"kmp.launch: showing worker 0's output; workers 1-2 write to {logs}/worker-<i>.log "
        '(output="all" shows every worker\'s); the runtimes\' own log lines go to the log files '
        'only (output="verbose" shows them)', "[worker 0] to stderr 0"]
    for i in range(3):  # each file holds its worker's two lines (the two pipes' order varies)
        assert sorted((logs / f"worker-{i}.log").read_text().splitlines()) == [
            f"hello from {i}", f"to stderr {i}"]


def test_the_default_log_folder_is_per_job_in_the_temporary_folder(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.setenv("KMP_JOB_ID", "job42")
    _launch(_chatty)
    _launch(_chatty)  # the same job id again: a folder of its own
    logs = tmp_path / "kmp-launch-logs"
    assert sorted(p.name for p in logs.iterdir()) == ["job42", "job42-2"]
    assert "hello from 1" in (logs / "job42-2" / "worker-1.log").read_text()
    assert f"writes to {logs}/job42/worker-<i>.log" in capsys.readouterr().err


def test_a_hidden_workers_failure_shows_the_end_of_its_log(tmp_path):
    (tmp_path / "pids").mkdir()
    with pytest.raises(WorkerFailedError) as info:
        _launch(_fail_on_worker_1, args=("print-raise", str(tmp_path / "pids")),
                log_dir=str(tmp_path / "logs"))
    err = info.value
    assert (err.worker_index, err.output_shown) == (1, False)
    assert err.log_path == str(tmp_path / "logs" / "worker-1.log")
    assert err.output_tail[-1] == "worker 1 about to fail"
    assert str(err).endswith(f"Last lines of worker 1's output (all of it in {err.log_path}):"
                             "\nworker 1 about to fail")


def test_output_must_be_chief_or_all():
    with pytest.raises(ValueError, match="output must be \"chief\".*Received: output='every'"):
        kmp.launch(_chatty, output="every")


def test_a_raising_worker_stops_the_others_and_reports_its_traceback(tmp_path):
    with pytest.raises(WorkerFailedError) as info:
        _launch(_fail_on_worker_1, args=("raise", str(tmp_path)))
    assert _stopped_before_their_sleep_ended(tmp_path)
    err = info.value
    assert isinstance(err, RuntimeError) and kmp.launch.WorkerFailedError is WorkerFailedError
    assert (err.worker_index, err.exitcode, err.signal) == (1, 1, None)
    assert "ValueError: boom from worker 1" in err.remote_traceback
    assert 'raise ValueError("boom from worker 1")' in err.remote_traceback
    assert isinstance(err.remote_exception, ValueError)
    message = str(err)
    assert message.startswith("Worker 1 of 2 raised ValueError (exit code 1).")
    assert "ValueError: boom from worker 1" in message
    assert "_worker.py" not in message  # the bootstrap's frames are hidden
    assert err.other_failures == {}
    assert _gone(_pids(tmp_path)["worker-0"])


def test_a_killed_worker_is_reported_with_its_signal(tmp_path):
    with pytest.raises(WorkerFailedError) as info:
        _launch(_fail_on_worker_1, args=("sigkill", str(tmp_path)))
    assert _stopped_before_their_sleep_ended(tmp_path)
    err = info.value
    assert (err.worker_index, err.exitcode, err.signal) == (1, -9, "SIGKILL")
    assert err.remote_traceback is None
    assert "Worker 1 of 2 was killed by signal SIGKILL (exit code -9)" in str(err)
    assert _gone(_pids(tmp_path)["worker-0"])


@pytest.mark.parametrize("code", [3, 0])
def test_sys_exit_in_a_worker_is_a_failure_with_its_exit_code(tmp_path, code):
    with pytest.raises(WorkerFailedError) as info:
        _launch(_fail_on_worker_1, args=(f"exit{code}", str(tmp_path)))
    err = info.value
    assert (err.worker_index, err.exitcode) == (1, code)
    assert f"Worker 1 of 2 exited with code {code}." in str(err)
    assert f"sys.exit({code})" in err.remote_traceback


def test_a_result_that_cannot_be_pickled_is_a_failure(tmp_path):
    with pytest.raises(WorkerFailedError) as info:
        _launch(_fail_on_worker_1, args=("unpicklable_result", str(tmp_path)))
    assert info.value.worker_index == 1
    assert "fn returned a lock, which cannot be pickled back" in str(info.value)


def test_the_first_failure_is_raised_and_the_others_are_mentioned(tmp_path):
    with pytest.raises(WorkerFailedError) as info:
        _launch(_both_fail, args=(str(tmp_path),))
    err = info.value
    assert (err.worker_index, err.other_failures) == (1, {0: 1})
    assert "ValueError: failure of worker 1" in err.remote_traceback
    assert str(err).startswith(
        "Worker 1 of 2 raised ValueError (exit code 1). "
        "Also failed: worker 0 raised ValueError (exit code 1).\n"
    )


def test_no_orphans_remain_after_a_failure(tmp_path):
    with pytest.raises(WorkerFailedError):
        _launch(_fail_on_worker_1, args=("raise", str(tmp_path), True))
    pids = _pids(tmp_path, "grandchild")
    assert list(pids) == ["grandchild-0"]
    assert _wait_until(lambda: _gone(pids["grandchild-0"]), timeout=5)


def test_unpicklable_fn_fails_before_any_process_starts(monkeypatch):
    supervisor_module = importlib.import_module("keras_mgpu_plugins.launch._supervisor")

    def no_process(*args, **kwargs):
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", no_process)
    lock = threading.Lock()
    with pytest.raises(NotPicklableError, match=r"fn must be picklable.*_thread\.lock") as info:
        _launch(lambda: lock.locked())
    assert isinstance(info.value, TypeError)
    with pytest.raises(NotPicklableError, match="args must be picklable"):
        _launch(_square, args=(lock,))


def test_timeout_stops_every_worker(tmp_path):
    with pytest.raises(LaunchTimeoutError) as info:
        _launch(_sleep_and_record, args=(str(tmp_path),), timeout=1.5)
    assert _stopped_before_their_sleep_ended(tmp_path)
    err = info.value
    assert isinstance(err, TimeoutError)
    assert (err.timeout, err.running_workers) == (1.5, [0, 1])
    assert str(err).startswith("The run did not finish within timeout=1.5 seconds: workers 0, 1 "
                               "of 2 had not finished. All workers were stopped.\n  worker 0: ")
    assert sorted(err.stacks) == [0, 1]  # as each printed them before it was stopped
    assert all("(MainThread), most recent call first:" in text for text in err.stacks.values())
    assert all(_gone(pid) for pid in _pids(tmp_path).values())


_PARENT_SCRIPT = """
import sys, time
import keras_mgpu_plugins as kmp

class Point:
    def __init__(self, x):
        self.x = x

def make_point(x):  # defined in __main__: sent by value
    return Point(x + int(__import__("os").environ["KMP_WORKER_INDEX"]))

def sleep_and_record(pid_dir):
    import os, pathlib
    index = os.environ["KMP_WORKER_INDEX"]
    tmp = pathlib.Path(pid_dir) / f".worker-{index}.tmp"  # whole, as the test reads it
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, pathlib.Path(pid_dir) / f"worker-{index}")
    time.sleep(60)

if sys.argv[1] == "main":
    points = kmp.launch(make_point, args=(10,), create_strategy=False)
    print("RESULT", [p.x for p in points], all(isinstance(p, Point) for p in points))
else:
    try:
        kmp.launch(sleep_and_record, args=(sys.argv[2],), create_strategy=False)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
"""


def _parent(tmp_path, *args):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(_PARENT_SCRIPT))
    pythonpath = filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    return subprocess.Popen([sys.executable, str(script), *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_functions_and_classes_defined_in_main_round_trip(tmp_path):
    out, err = _parent(tmp_path, "main").communicate(timeout=60)
    assert "RESULT [10, 11] True" in out, err


@pytest.mark.parametrize("how, times", [(signal.SIGINT, 1), (signal.SIGINT, 3), (signal.SIGKILL, 1)],
                         ids=["ctrl-c", "ctrl-c-thrice", "sigkill"])
def test_workers_stop_when_the_parent_is_interrupted_or_dies(tmp_path, how, times):
    parent = _parent(tmp_path, "sleep", str(tmp_path))
    try:
        assert _wait_until(lambda: len(_pids(tmp_path)) == 2), parent.stderr
        workers = list(_pids(tmp_path).values())
        for _ in range(times):  # pressed again, while the launcher stops the workers
            parent.send_signal(how)
            time.sleep(0.02)
        out, _ = parent.communicate(timeout=30)  # never a hang
        if how == signal.SIGINT and times == 1:
            assert "INTERRUPTED" in out and parent.returncode == 0
        elif how == signal.SIGINT:  # a press after launch returned interrupts the script itself
            assert parent.returncode in (0, -signal.SIGINT)
        assert _wait_until(lambda: all(_gone(pid) for pid in workers), timeout=10)
    finally:
        parent.kill()


def _all_reduce_after_a_tf_op():
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow.strategy import get_strategy

    before = tf.constant(1.0) + 1.0  # the runtime is running: a strategy made now would fail
    strategy = get_strategy("multi_worker")
    index = kmp.topology().worker_index
    total = strategy.reduce(
        tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(float(index + 1))), axis=None
    )
    return type(strategy).__name__, strategy.num_replicas_in_sync, float(total), float(before)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_each_worker_has_its_multi_worker_strategy_before_fn_runs():
    pytest.importorskip("keras_mgpu_plugins.strategy")
    results = kmp.launch(_all_reduce_after_a_tf_op, num_workers=2, timeout=200)
    assert results == [("CollectiveAllReduceStrategy", 2, 3.0, 2.0)] * 2


def _job_id():
    return os.environ["KMP_JOB_ID"]


def test_every_worker_of_a_run_shares_one_job_id(monkeypatch):
    monkeypatch.delenv("KMP_JOB_ID", raising=False)
    first = kmp.launch(_job_id, num_workers=2, create_strategy=False, timeout=60)
    second = kmp.launch(_job_id, num_workers=2, create_strategy=False, timeout=60)
    assert first[0] == first[1] and second[0] == second[1]
    assert first[0] != second[0] and len(first[0]) == 12
    monkeypatch.setenv("KMP_JOB_ID", "my-job")
    assert kmp.launch(_job_id, num_workers=2, create_strategy=False, timeout=60) == ["my-job"] * 2
