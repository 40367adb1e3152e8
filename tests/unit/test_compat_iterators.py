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
