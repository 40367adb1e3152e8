"""The release thread of `kmp.compat`'s `release_iterators_off_thread` patch, on plain objects.

The patch on real distributed iterators is tested in a 2-worker job
(tests/multi_worker/test_fit_settings.py).
"""

from __future__ import annotations

import threading
import time
import weakref

import pytest

from keras_mgpu_plugins.backends.tensorflow.patches import iterators as ci


class Resource:
    """Stands for an iterator: records the thread that destroys it."""


@pytest.fixture
def own_state(monkeypatch):
    monkeypatch.setattr(ci, "_kept", [])
    monkeypatch.setattr(ci, "_stalled", False)
    monkeypatch.setattr(ci, "_busy_since", None)


def watch(obj, threads, done):
    weakref.finalize(obj, lambda: (threads.append(threading.current_thread().name), done.set()))


def test_only_unreferenced_objects_are_released_and_on_the_release_thread(own_state):
    threads: list[str] = []
    done = threading.Event()
    used, finished = Resource(), Resource()
    watch(finished, threads, done)
    ci._kept.extend([used, finished])
    del finished  # its call has returned: only the module holds it
    assert ci.release_unused() == 1
    assert done.wait(30)
    assert threads == [ci.REAPER_NAME]
    assert ci._kept == [used]  # still referenced here: kept, not destroyed


def test_a_stalled_release_thread_stops_the_keeping_with_a_warning(own_state):
    ci._busy_since = time.monotonic() - ci._STALL_S - 1
    with pytest.warns(RuntimeWarning, match="release_iterators_off_thread"):
        ci.release_unused()
    assert ci._stalled


class Blocking:
    """Stands for an iterator whose destruction waits for `gate`."""

    def __init__(self, gate):
        self.gate = gate

    def __del__(self):
        self.gate.wait(30)


def test_past_max_waiting_iterators_are_destroyed_on_the_calling_thread(own_state, monkeypatch):
    """Destructions that fall behind do not pile up without bound (memory)."""
    monkeypatch.setattr(ci, "MAX_WAITING", 3)
    gate = threading.Event()
    try:
        ci._kept.append(Blocking(gate))  # the release thread blocks on it
        assert ci.release_unused() == 1
        ci._kept.extend([Resource(), Resource()])
        assert ci.release_unused() == 2  # 3 waiting: the limit
        threads: list[str] = []
        done = threading.Event()
        extra = Resource()
        watch(extra, threads, done)
        ci._kept.append(extra)
        del extra
        assert ci.release_unused() == 0
        assert threads == [threading.current_thread().name]  # destroyed here, at once
    finally:
        gate.set()
    assert ci.wait_released(30)
    assert ci.release_state()["waiting"] == 0
