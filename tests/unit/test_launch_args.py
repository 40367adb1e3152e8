"""`kmp.launch` argument checks and helpers: errors come before any process starts."""

from __future__ import annotations

import importlib

import pytest

import keras_mgpu_plugins as kmp

launch_module = importlib.import_module("keras_mgpu_plugins.launch")
supervisor_module = importlib.import_module("keras_mgpu_plugins.launch._supervisor")


@pytest.fixture(autouse=True)
def no_workers(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("no worker may start in these tests")

    monkeypatch.setattr(launch_module, "_run", fail)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2", None])
def test_num_workers_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match=f"positive integer. Received: num_workers={value!r}$"):
        launch_module.launch(print, num_workers=value)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"fn": 3}, TypeError, "fn must be callable. Received: fn=3"),
        ({"args": {"a": 1}}, TypeError, "args must be a tuple or a list. Received: args={'a': 1}"),
        ({"args": "ab"}, TypeError, "Received: args='ab'"),
        ({"kwargs": [1]}, TypeError, "kwargs must be a dict or None. Received: kwargs=[1]"),
        ({"timeout": 0}, ValueError, "Received: timeout=0"),
        ({"timeout": float("inf")}, ValueError, "Received: timeout=inf"),
        ({"timeout": "5"}, ValueError, "Received: timeout='5'"),
        ({"env": ["A=1"]}, TypeError, "Received: env=['A=1']"),
        ({"env": {"A": 1}}, TypeError, "str to str or None. Received: env['A']=1"),
        ({"env": {"TF_CONFIG": "{}"}}, ValueError, "env may not set TF_CONFIG"),
        ({"env": {"KMP_WORKER_INDEX": "3"}}, ValueError, "env may not set KMP_WORKER_INDEX"),
        ({"stall_timeout": 0}, ValueError,
         'stall_timeout must be a positive number of seconds, None (no StallWatchdog) or "auto" '
         "(KMP_STALL_TIMEOUT where set, else 600). Received: stall_timeout=0"),
        ({"stall_timeout": "never"}, ValueError, "Received: stall_timeout='never'"),
        ({"stall_timeout": True}, ValueError, "Received: stall_timeout=True"),
        ({"env": {"KMP_STALL_TIMEOUT": "soon"}}, ValueError,
         "KMP_STALL_TIMEOUT must be a number of seconds (0: no StallWatchdog). "
         "Received: KMP_STALL_TIMEOUT='soon'"),
        ({"num_ps": -1}, ValueError, "num_ps must be a non-negative integer"),
        ({"num_ps": True}, ValueError, "Received: num_ps=True"),
        ({"num_ps": 1, "env": {"KERAS_BACKEND": "jax"}}, ValueError,
         "keras-team/keras#20753). Received: num_ps=1, KERAS_BACKEND='jax'"),
    ],
)
def test_bad_arguments_are_named_with_their_value(kwargs, error, message):
    kwargs = {"fn": print, **kwargs}
    with pytest.raises(error) as info:
        launch_module.launch(kwargs.pop("fn"), **kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("kwargs, expected", [
    ({}, 600.0),  # no hang is silent: launch.DEFAULT_STALL_TIMEOUT
    ({"stall_timeout": 30}, 30.0),
    ({"stall_timeout": None}, None),  # no watchdog
    ({"env": {"KMP_STALL_TIMEOUT": "7"}}, 7.0),  # the workers' environment sets the default
    ({"env": {"KMP_STALL_TIMEOUT": "0"}}, None),
    ({"env": {"KMP_STALL_TIMEOUT": "7"}, "stall_timeout": 30}, 30.0),
])
def test_every_fit_gets_a_stall_watchdog_unless_told_not_to(monkeypatch, kwargs, expected):
    monkeypatch.delenv("KMP_STALL_TIMEOUT", raising=False)
    seen = []
    monkeypatch.setattr(launch_module, "_run", lambda spec, *args: seen.append(spec) or [None])
    launch_module.launch(print, num_workers=1, **kwargs)
    assert seen[0]["stall_timeout"] == expected


def stuck_where_the_test_can_see_it(job_dir):
    return launch_module._stacks.ask(job_dir, [0, 1], wait_s=3)


def test_stacks_are_asked_for_and_answered_through_the_job_folder(tmp_path):
    """Worker 0's watch thread answers (here a thread of this process); worker 1 never does."""
    import threading
    import time

    from keras_mgpu_plugins.launch import _stacks

    def worker_0_watch():
        deadline = time.monotonic() + 10
        while not _stacks.answer_if_asked(str(tmp_path), 0) and time.monotonic() < deadline:
            time.sleep(0.05)

    watch = threading.Thread(target=worker_0_watch)
    watch.start()
    answers = stuck_where_the_test_can_see_it(str(tmp_path))
    watch.join(10)
    assert answers[1] is None and answers[0]["inside"] is False
    assert answers[0]["where"].startswith("in stuck_where_the_test_can_see_it (")
    lines = _stacks.describe(answers, 2, 3).splitlines()
    assert lines[0].startswith("  worker 0: in stuck_where_the_test_can_see_it (")
    assert lines[1] == ("  worker 1: did not answer within 3 s (its Python is blocked: a native "
                        "call holding the GIL, or the process is stopped)")
    assert lines[2] == "Python stacks of worker 0 of 2 (all threads):"  # no one is inside
    assert lines[3].startswith("[worker 0] Thread 0x")
    assert any(line.startswith("[worker 0] Thread 0x") and "(MainThread)" in line for line in lines)
    assert any(line.endswith("in stuck_where_the_test_can_see_it") for line in lines)
    waiting = {**answers, 0: {**answers[0], "inside": True, "where": "inside TensorFlow at x"}}
    lines = _stacks.describe(waiting, 2, 3).splitlines()
    assert lines[:3] == [
        "  worker 0: inside TensorFlow at x", lines[1],
        "  Likely stuck: worker 1, outside TensorFlow and JAX while the others wait inside (for "
        "it, in a collective)."]


def test_kwargs_that_cannot_be_pickled_are_named():
    import threading

    with pytest.raises(launch_module.NotPicklableError, match="kwargs must be picklable") as info:
        launch_module.launch(print, kwargs={"lock": threading.Lock()})
    assert isinstance(info.value, TypeError) and isinstance(info.value, launch_module.LaunchError)


def test_free_ports_are_distinct_and_released():
    import socket

    ports = supervisor_module.free_ports(4)
    assert len(set(ports)) == 4
    for port in ports:  # released: each can be bound again
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_failing_to_find_ports_is_a_launch_error(monkeypatch):
    def refuse(self, address):
        raise OSError(99, "Cannot assign requested address")

    monkeypatch.setattr(supervisor_module.socket.socket, "bind", refuse)
    with pytest.raises(launch_module.LaunchError, match="Could not find 2 free TCP ports"):
        supervisor_module.free_ports(2)


def test_exceptions_are_reachable_from_kmp_launch_and_typed():
    assert kmp.launch.WorkerFailedError is launch_module.WorkerFailedError
    assert kmp.launch.LaunchTimeoutError is launch_module.LaunchTimeoutError
    assert issubclass(launch_module.WorkerFailedError, RuntimeError)
    assert issubclass(launch_module.LaunchTimeoutError, TimeoutError)
    assert issubclass(launch_module.NotPicklableError, TypeError)
    err = launch_module.WorkerFailedError(
        "m", summary="s", worker_index=1, num_workers=2, exitcode=-9)
    assert (err.signal, err.remote_traceback, err.other_failures) == ("SIGKILL", None, {})
    assert launch_module.WorkerFailedError(
        "m", summary="s", worker_index=1, num_workers=2, exitcode=3).signal is None


def test_the_module_is_callable_like_the_function():
    """`kmp.launch` is the module once it was imported by name: calling it still launches."""
    with pytest.raises(ValueError, match="num_workers=0"):
        launch_module(print, num_workers=0)


def test_ctrl_c_while_workers_run_sets_an_event_instead_of_raising_anywhere():
    """A KeyboardInterrupt inside Popen.poll() could leave its lock held and hang the shutdown."""
    import os
    import signal

    from keras_mgpu_plugins.launch import _signals, _supervisor

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with _signals.caught() as caught:
        os.kill(os.getpid(), signal.SIGINT)  # delivered at once, to this (the main) thread
        assert caught.interrupted.wait(5)  # noticed, nothing raised
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):  # the supervisor raises it at its safe point
        _supervisor._supervise([], None, True, caught)


def test_stop_signals_while_workers_run_are_recorded_in_order_and_handlers_restored():
    import os
    import signal

    from keras_mgpu_plugins.launch import _signals

    with _signals.caught() as caught:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert (caught.take_stop(), caught.take_stop(), caught.take_stop()) == (
            signal.SIGTERM, signal.SIGUSR1, None)
        assert not caught.interrupted.is_set()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_a_sigint_handler_of_the_callers_own_is_left_alone():
    import signal

    from keras_mgpu_plugins.launch import _signals

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, mine)
    try:
        with _signals.caught() as caught:
            assert signal.getsignal(signal.SIGINT) is mine
            assert signal.getsignal(signal.SIGTERM) == caught._record  # the default was replaced
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)


def test_kmp_output_keeps_progress_bars_in_one_process_and_refuses_other_values(monkeypatch):
    from keras_mgpu_plugins import _worker_output

    monkeypatch.delenv("KMP_OUTPUT", raising=False)
    assert _worker_output.quiet_here() is False  # one process: it is the chief
    monkeypatch.setenv("KMP_OUTPUT", "none")
    with pytest.raises(ValueError, match="KMP_OUTPUT must be \"chief\".*Received: KMP_OUTPUT='none'"):
        _worker_output.quiet_here()
