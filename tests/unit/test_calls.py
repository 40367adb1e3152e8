"""`runtime.calls.together` and TensorFlow's store over its coordination service, without
processes: a fake eager context and a fake runtime (the real ones: tests/multi_worker/test_calls.py).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from keras_mgpu_plugins.backends.tensorflow import store as tf_store
from keras_mgpu_plugins.backends.tensorflow.runtime import TensorFlowRuntime
from keras_mgpu_plugins.runtime import Rank, calls


class FakeContext:
    """TensorFlow's eager context as the store uses it: set, and a get that times out."""

    def __init__(self, values=None, fail=None):
        self.values = dict(values or {})
        self.fail = fail
        self.asked: list[tuple[str, int]] = []

    def set_config_key_value(self, key, value):
        if self.fail:
            raise self.fail
        self.values[key] = value

    def get_config_key_value(self, key, timeout_in_ms=0):
        self.asked.append((key, timeout_in_ms))
        if self.fail:
            raise self.fail
        if key not in self.values:
            raise tf.errors.DeadlineExceededError(None, None, f"GetKeyValue() timed out: {key}")
        return self.values[key]


def test_a_key_read_once_is_kept_and_an_absent_one_asked_again():
    context = FakeContext({"a/0": "x"})
    store = tf_store.TensorFlowStore(context, processes=2)
    assert store.get("a/0") == "x" and store.get("a/0") == "x"
    assert store.get("a/1") is None and store.get("a/1") is None
    assert [key for key, _ in context.asked] == ["a/0", "a/1", "a/1"]


def test_dir_asks_each_process_index_and_returns_the_keys_there():
    context = FakeContext({"kmp/calls/3/0": "fit|m|x.py:1", "kmp/calls/3/2": "fit|m|x.py:1"})
    store = tf_store.TensorFlowStore(context, processes=3)
    assert store.dir("kmp/calls/3/") == {0: "fit|m|x.py:1", 2: "fit|m|x.py:1"}
    assert [key for key, _ in context.asked] == [f"kmp/calls/3/{i}" for i in range(3)]


@pytest.mark.parametrize(("slowest", "expected"), [(0.0, 20), (0.001, 20), (0.05, 200),
                                                   (2.0, 1000)])
def test_an_absent_key_is_waited_for_20_ms_or_4_round_trips_up_to_1_s(slowest, expected):
    store = tf_store.TensorFlowStore(FakeContext(), processes=2)
    store.slowest = slowest
    assert store.miss_ms() == expected
    store.get("absent")
    assert store.get("absent") is None and store.context.asked[-1] == ("absent", expected)


def test_any_other_tensorflow_error_is_an_unreachable_store_naming_its_cause():
    gone = tf.errors.UnavailableError(None, None, "failed to connect to all addresses\nmore")
    store = tf_store.TensorFlowStore(FakeContext(fail=gone), processes=2)
    for action in (lambda: store.set("k", "v"), lambda: store.get("k")):
        with pytest.raises(calls.StoreUnreachableError, match=r"process 0 \(the chief\)") as info:
            action()
        assert "UnavailableError: failed to connect to all addresses)" in str(info.value)


def test_one_process_has_no_store():
    assert TensorFlowRuntime().store() is None  # the default strategy spans this process only


class FakeRuntime:
    """Process `me` of `count`, whose store answers for the others as `theirs(n)` says."""

    spans_workers = True

    def __init__(self, theirs, me=0, count=2, fail=None):
        self.context = FakeContext(fail=fail)
        self.client = tf_store.TensorFlowStore(self.context, count)
        self.theirs, self.me, self.count = theirs, me, count
        original = self.client.set

        def set_and_answer(key, value):
            original(key, value)
            n = int(key.split("/")[2])
            self.context.values.update(self.theirs(n))

        self.client.set = set_and_answer
        self.worker_index = me

    def store(self):
        return self.client

    def rank(self):
        return Rank(self.me, self.count, self.me == 0)


class Model:
    name = "tiny"


@pytest.fixture(autouse=True)
def no_exit_hook(monkeypatch):
    monkeypatch.setitem(calls._state, "exit_hook", True)  # no fake store posted at exit


def test_the_same_call_everywhere_goes_on_without_asking_who_ended():
    runtime = FakeRuntime(lambda n: {f"kmp/calls/{n}/1": "evaluate|tiny|job.py:9"})
    calls.together(runtime, "evaluate", Model())
    assert not [key for key, _ in runtime.context.asked if "/end/" in key]


def test_another_method_on_another_process_raises_naming_both():
    runtime = FakeRuntime(lambda n: {f"kmp/calls/{n}/1": "predict|tiny|job.py:12"})
    with pytest.raises(calls.CallsDifferError) as info:
        calls.together(runtime, "evaluate", Model())
    message = str(info.value)
    assert message.startswith("evaluate(...) of a model kmp distributed over 2 processes")
    assert "process 0: tiny.evaluate(...) at " in message
    assert "process 1: tiny.predict(...) at job.py:12" in message


def test_a_process_that_ended_raises_once_the_wait_passes_ended_after():
    runtime = FakeRuntime(lambda n: {"kmp/calls/end/1": str(n)})
    with pytest.raises(calls.CallsDifferError, match="process 1: ended its script after"):
        calls.together(runtime, "evaluate", Model())


def test_an_unreachable_store_raises_calls_differ_naming_this_call_and_the_cause():
    gone = tf.errors.UnavailableError(None, None, "Connection refused")
    runtime = FakeRuntime(lambda n: {}, me=1, fail=gone)
    with pytest.raises(calls.CallsDifferError) as info:
        calls.together(runtime, "evaluate", Model())
    message = str(info.value)
    assert "process 1: tiny.evaluate(...) at " in message
    assert "TensorFlow: UnavailableError: Connection refused" in message
