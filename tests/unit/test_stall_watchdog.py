"""StallWatchdog's pure parts (verdict, stack reading, heartbeats) and arguments."""

from __future__ import annotations

import sys
import threading
import time
import traceback

import pytest

from keras_mgpu_plugins import compat
from keras_mgpu_plugins.callbacks import _stall
from keras_mgpu_plugins.callbacks.stall_watchdog import StallWatchdog


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "10", None, True])
def test_bad_timeout_is_named(timeout):
    with pytest.raises(ValueError, match=r"timeout must be a positive number.*Received: timeout="):
        StallWatchdog(timeout=timeout)


def test_bad_directory_is_named():
    with pytest.raises(TypeError, match="Received: directory=3"):
        StallWatchdog(timeout=5, directory=3)


def test_defaults():
    watchdog = StallWatchdog()
    assert watchdog.timeout == 600.0 and watchdog.directory is None
    assert watchdog.poll_interval == 1.0 and StallWatchdog(timeout=2).poll_interval == 0.2


def _report(worker, idle, inside_tf=True, progress=10, state="running", where="somewhere",
            written_at=1000.0):
    return _stall.Report(worker, idle, written_at, progress, state, inside_tf, where)


def test_no_stall_while_one_worker_progresses():
    reports = {0: _report(0, 30), 1: _report(1, 3, inside_tf=False)}
    assert _stall.decide(reports, 2, 20, now=1000.0, unreported_idle=0) is None


def test_stale_heartbeat_counts_as_idle():
    reports = {0: _report(0, 30, written_at=1004.0), 1: _report(1, 16, inside_tf=False)}
    verdict = _stall.decide(reports, 2, 20, now=1004.0, unreported_idle=0)
    assert verdict is not None and verdict.stuck == (1,)


def test_a_stale_heartbeat_is_waited_for_then_its_silent_worker_named():
    """A loaded machine delays a heartbeat: its `where` is old news (worker 0 was seen
    between two collectives, outside TensorFlow), so no verdict blames it; once silent for
    `timeout`, the worker itself is stuck (a waiting worker's thread keeps writing)."""
    waiting_seen_in_python = _report(0, 15, inside_tf=False, where="in on_epoch_end (k.py:3)")
    def stuck_one(now):
        return _report(1, 40, inside_tf=False, where="in sleep_forever (t.py:9)", written_at=now)

    reports = {0: waiting_seen_in_python, 1: stuck_one(1012.0)}
    assert _stall.decide(reports, 2, 20, now=1012.0, unreported_idle=0) is None
    reports = {0: waiting_seen_in_python, 1: stuck_one(1020.0)}
    verdict = _stall.decide(reports, 2, 20, now=1020.0, unreported_idle=0)
    assert verdict.stuck == (0, 1)
    assert "worker 0: stuck: its heartbeat stopped 20 s ago" in verdict.message
    fresh = {0: _report(0, 21, where="inside TensorFlow at all_reduce", written_at=1010.0),
             1: stuck_one(1012.0)}
    assert _stall.decide(fresh, 2, 20, now=1012.0, unreported_idle=0).stuck == (1,)


def test_stuck_is_the_worker_outside_tensorflow():
    reports = {0: _report(0, 25, where="inside TensorFlow at all_reduce"),
               1: _report(1, 21, inside_tf=False, where="in sleep_forever (x/train.py:9)")}
    verdict = _stall.decide(reports, 2, 20, now=1000.0, unreported_idle=0)
    assert verdict.stuck == (1,)
    assert "stuck: worker 1\n" in verdict.message
    assert "worker 0: waiting inside TensorFlow at all_reduce" in verdict.message
    assert "worker 1: stuck in sleep_forever (x/train.py:9)" in verdict.message


def test_a_worker_that_reads_no_peer_names_only_itself():
    """No shared heartbeat folder (a scheduler's job across hosts): a worker stuck in Python
    names itself after `timeout`; one waiting inside its framework (for a peer that will
    fail first) fails after twice `timeout`, naming no one stuck."""
    stuck = _report(1, 21, inside_tf=False, where="in act (conformance/job.py:136)")
    verdict = _stall.decide_alone(stuck, 1, 20, now=1000.0)
    assert verdict.stuck == (1,) and "stuck: worker 1\n" in verdict.message
    assert "worker 1: stuck in act (conformance/job.py:136)" in verdict.message
    assert "directory=" in verdict.message
    waiting = _report(0, 25, where="inside JAX at convert_to_numpy (jax/core.py:409)")
    assert _stall.decide_alone(waiting, 0, 20, now=1000.0) is None
    late = _stall.decide_alone(_report(0, 41, where="inside JAX at x"), 0, 20, now=1000.0)
    assert late.stuck == () and "a peer is stuck or gone" in late.message
    assert _stall.decide_alone(_report(0, 99, state="busy"), 0, 20, now=1000.0) is None


def test_all_inside_tensorflow_names_the_least_progress():
    reports = {0: _report(0, 25, progress=12), 1: _report(1, 22, progress=9),
               2: _report(2, 30, progress=12)}
    verdict = _stall.decide(reports, 3, 20, now=1000.0, unreported_idle=0)
    assert verdict.stuck == (1,) and "least progress" in verdict.message


def test_busy_worker_pauses_everyone_and_finished_ones_do_not_count():
    busy = {0: _report(0, 99), 1: _report(1, 99, state="busy")}
    assert _stall.decide(busy, 2, 20, now=1000.0, unreported_idle=99) is None
    finished = {0: _report(0, 99, inside_tf=False), 1: _report(1, 0, state="finished")}
    assert _stall.decide(finished, 2, 20, now=1000.0, unreported_idle=99).stuck == (0,)


def test_unreported_worker_is_stuck_once_the_judge_waited_timeout():
    reports = {0: _report(0, 50), 1: None}
    assert _stall.decide(reports, 2, 20, now=1000.0, unreported_idle=10) is None
    verdict = _stall.decide(reports, 2, 20, now=1000.0, unreported_idle=25)
    assert verdict.stuck == (1,) and "worker 1: stuck: it never reported" in verdict.message


def sleeping_in_user_code(started: threading.Event, stop: threading.Event) -> None:
    started.set()
    stop.wait()


def test_locate_and_format_stacks_on_a_real_thread():
    started, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=sleeping_in_user_code, args=(started, stop),
                              name="sleeper")
    thread.start()
    try:
        started.wait()
        time.sleep(0.05)
        busy, inside_tf, where = _stall.locate(sys._current_frames()[thread.ident])
        stacks = _stall.format_stacks(prefix="[worker 3] ")
    finally:
        stop.set()
        thread.join()
    assert (busy, inside_tf) == ("", False)
    assert where.startswith("in sleeping_in_user_code (unit/test_stall_watchdog.py:")
    assert "(sleeper), most recent call first:" in stacks
    assert all(line.startswith("[worker 3] ") for line in stacks.splitlines())
    assert "in sleeping_in_user_code" in stacks and "in test_locate_and_format" in stacks


def test_board_files_round_trip_and_claim_once(tmp_path):
    first, second = _stall.Board(str(tmp_path), 0), _stall.Board(str(tmp_path), 1)
    first.publish(_stall.Report(0, 1.5, time.time(), 7, "running", True, "here"))
    reports = second.read(2, since=time.time() - 60)
    assert reports[0].progress == 7 and reports[0].where == "here" and reports[1] is None
    assert second.read(2, since=time.time() + 60)[0] is None  # from an earlier fit
    assert second.stall() is None
    assert second.claim("worker 1 says") == "worker 1 says"
    assert first.claim("worker 0 says") == "worker 1 says" == first.stall()


def _tiny_fit(callbacks, **kwargs):
    import keras
    import numpy as np

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.ones((8, 2), "float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0, callbacks=callbacks,
              validation_data=(x, x[:, :1]), **kwargs)
    return model


@pytest.mark.slow  # a real fit
def test_fit_publishes_heartbeats_and_stops_its_thread(tmp_path):
    watchdog = StallWatchdog(timeout=0.5, directory=str(tmp_path))  # polls every 0.05 s
    before = threading.active_count()
    _tiny_fit([watchdog])  # first-step tracing takes longer than 0.5 s: the clock pauses
    assert watchdog._thread is None and threading.active_count() == before
    report = _stall.Board(str(tmp_path), 1).read(1, since=0)[0]
    assert report.state == "finished" and report.progress >= 2 * 2 + 2 * 2
    assert not (tmp_path / "stall.txt").exists()


@pytest.mark.slow  # a real fit
def test_add_to_every_fit_adds_one_watchdog(monkeypatch):
    import keras

    from keras_mgpu_plugins.callbacks import stall_watchdog

    monkeypatch.setattr(keras.Model, "fit", keras.Model.fit)
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.append([type(c).__name__ for c in self.model._kmp_spy_callbacks])

    original = keras.callbacks.CallbackList.__init__

    def record(self, callbacks=None, *args, **kwargs):
        original(self, callbacks, *args, **kwargs)
        if self.model is not None:
            self.model._kmp_spy_callbacks = list(self.callbacks)

    monkeypatch.setattr(keras.callbacks.CallbackList, "__init__", record)
    stall_watchdog.add_to_every_fit(30)
    stall_watchdog.add_to_every_fit(30)  # twice: still one
    try:
        _tiny_fit([Spy()])
        own = StallWatchdog(timeout=40)
        _tiny_fit([Spy(), own])
        assert seen[0].count("StallWatchdog") == 1 and seen[1].count("StallWatchdog") == 1
        with pytest.raises(ValueError, match="Received: timeout=0"):
            stall_watchdog.add_to_every_fit(0)
    finally:
        compat.remove("stall_watchdog_on_every_fit")  # a registered patch (kmp.compat.PATCHES)


def test_a_step_blocked_inside_a_tf_function_is_not_taken_for_tracing():
    """After the first call, every call of a `tf.function` has
    `tracing_compilation.call_function` on its stack; only `func_graph.py` (tracing itself)
    pauses the clock. A train step waiting in a collective for a stuck peer must count as
    idle, or no stall is ever declared."""
    import tensorflow as tf

    entered, release, seen = threading.Event(), threading.Event(), {}

    def block(x):  # runs when the traced graph executes (a collective waiting for a peer)
        entered.set()
        release.wait()
        return x

    @tf.function
    def step(x):
        seen["tracing"] = _stall.locate(sys._getframe())  # Python runs only while tracing
        return tf.py_function(block, [x], tf.float32)

    release.set()
    step(tf.constant(1.0))  # traces, then runs
    entered.clear()
    release.clear()
    thread = threading.Thread(target=step, args=(tf.constant(2.0),), name="step")
    thread.start()
    try:
        assert entered.wait(60)
        frame = sys._current_frames()[thread.ident]
        busy, inside_tf, _ = _stall.locate(frame)
        names = [f.name for f in traceback.extract_stack(frame)]
        call = _stall.outermost_call(frame)
        on_stack = call is not None and _stall.has_frame(frame, call)
    finally:
        release.set()
        thread.join()
    assert seen["tracing"][0] == "tracing a function"
    assert "call_function" in names  # tracing_compilation's, on every call after the first
    assert busy == "" and on_stack
    assert _stall.outermost_call(sys._getframe()) is None


def test_the_first_run_of_a_function_just_traced_pauses_the_clock_up_to_timeout():
    """Tracing, then the same call's first run (graph optimization, collective setup):
    busy, but only up to `timeout` after the tracing was last seen; a later call is not."""
    import tensorflow as tf

    from keras_mgpu_plugins.callbacks.stall_watchdog import _Watch

    tracing, executing, go = threading.Event(), threading.Event(), threading.Event()
    finish = threading.Event()  # not `go`: set while the first run starts, it would not block

    def block(x):
        executing.set()
        finish.wait()
        return x

    @tf.function
    def step(x):
        tracing.set()
        go.wait()  # Python in a tf.function runs only while it is traced
        return tf.py_function(block, [x], tf.float32)

    watch = _Watch(timeout=30.0, interval=1.0, directory=None, stop=threading.Event())

    def look(thread):
        return watch._report(sys._current_frames()[thread.ident])

    def call():
        thread = threading.Thread(target=step, args=(tf.constant(1.0),), name="step")
        thread.start()
        return thread

    states = []
    thread = call()
    try:
        assert tracing.wait(60)
        states.append(look(thread).where)
        go.set()  # tracing ends; the first run blocks in `block`
        assert executing.wait(60)
        executing.clear()
        states.append(look(thread).where)
        watch.traced_at -= 30.0  # as if the first run had lasted `timeout`
        states.append(look(thread).state)
    finally:
        go.set()
        finish.set()
        thread.join()
    finish.clear()
    thread = call()  # traced already: a step like any other
    try:
        assert executing.wait(60)
        states.append(look(thread).state)
    finally:
        finish.set()
        thread.join()
    assert states[0].endswith("(tracing a function)")
    assert states[1].endswith("(first run of a function just traced)")
    assert states[2:] == ["running", "running"]
