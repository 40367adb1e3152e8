"""Keras patch: the distributed iterators a multi-worker `fit` used are released off the training thread.

`patch_release_iterators_off_thread` keeps every distributed iterator Keras's
`TFEpochIterator` makes under a distributing strategy until the call that used
it (`fit`, `evaluate`, `predict`) has returned, then drops it on a thread of its
own, so that its destruction (the MultiDeviceIterator, its per-device
functions) no longer runs on the training thread.
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
import time
import warnings
from typing import Any

from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require

#: The thread that destroys released iterators (its name, for tests and stack dumps).
REAPER_NAME = "kmp-iterator-release"
_EXIT_DEADLINE_S = 60.0  # at exit, how long the last releases may take
_STALL_S = 60.0  # one destruction taking longer: stop keeping iterators (Keras's behaviour)
#: Iterators waiting for the release thread at most; more are destroyed where Keras would
#: (the training thread), so memory stays bounded when destructions fall behind.
MAX_WAITING = 64

_lock = threading.Lock()
_kept: list[Any] = []  # iterators handed to Keras, not yet released
_released: queue.Queue | None = None
_reaper: threading.Thread | None = None
_busy_since: float | None = None  # when the release thread began its current destruction
_stalled = False


def patch_release_iterators_off_thread() -> Any:
    """Keras drops the distributed iterator of a `fit` on the training thread, where destroying it blocks.

    `fit`'s epoch loop holds the last reference to the epoch's distributed
    iterator, so it is destroyed when `fit` returns, on the training thread.
    Under MultiWorkerMirroredStrategy that took 0.16-5 s per `fit` (median over
    fits; up to 15 s) on 2 workers sharing 2 cores, while the other worker
    waited in its next collective (`benchmarks/workers_throughput.py`, Keras
    3.15, TensorFlow 2.21), more than a 160-step `fit`'s compute; the same
    destruction on another thread took 5-10 ms. No upstream issue found.

    Under MultiWorkerMirroredStrategy every iterator `TFEpochIterator` makes
    of arrays (NumPy arrays, tensors: Keras's `ArrayDataAdapter`, a pipeline of
    TensorFlow ops only) is also kept here. When the next iterator is made (the
    next epoch, `fit`, `evaluate` or `predict`), each kept iterator that nothing
    else references any more (its call has returned) is handed to one
    background thread, `REAPER_NAME`, which drops it: nothing is leaked beyond
    the last call's iterators, released at exit (waited for at most 60 s). The
    data, and the order it is read in, do not change. Destructions fall behind
    under load (57 waiting, seconds each, seen on 2 workers sharing 2 busy cores
    with many 2-step fits): past `MAX_WAITING` waiting, further ones are
    destroyed on the training thread, as without the patch.

    Other inputs, and other strategies, are left to Keras: under
    MirroredStrategy a destruction on another thread was seen to block forever
    (after a sequence of fits of the test suite; not root-caused), and the cost
    was only measured on several workers. Should one destruction take over
    60 s, iterators are no longer kept (one warning).
    """
    iterator_class, array_adapter = resolve("tensorflow epoch iterator"), resolve("array data adapter")
    require("collective_all_reduce_multi_worker")
    multi_worker = resolve("collective_all_reduce_multi_worker")
    original = iterator_class._get_iterator

    def _get_iterator(self):
        dataset = original(self)
        release_unused()  # earlier calls' iterators, whatever this one's input
        if (_stalled or self._distribute_strategy is None
                or not multi_worker(self._distribute_strategy)
                or not isinstance(self.data_adapter, array_adapter)):
            return dataset
        return _Kept(dataset)

    iterator_class._get_iterator = _get_iterator
    return lambda: setattr(iterator_class, "_get_iterator", original)


class _Kept:
    """What Keras iterates over (`iter(...)` only): the dataset, its iterators kept."""

    def __init__(self, dataset: Any) -> None:
        self._dataset = dataset

    def __iter__(self) -> Any:
        iterator = iter(self._dataset)
        with _lock:
            _kept.append(iterator)
        return iterator


def release_unused() -> int:
    """Hands each kept iterator that only this module references to the release thread.

    Returns:
        How many were handed over.
    """
    global _stalled
    handed = 0
    busy_since = _busy_since
    if busy_since is not None and time.monotonic() - busy_since > _STALL_S and not _stalled:
        _stalled = True
        warnings.warn(
            f"kmp.compat patch release_iterators_off_thread: destroying a used distributed "
            f"iterator on thread {REAPER_NAME!r} has taken over {_STALL_S:.0f} s; from now on "
            "Keras destroys them on the training thread, as without the patch. Please report it.",
            RuntimeWarning, stacklevel=2)
    here = []  # destroyed on this thread, after the lock: the release thread is behind
    with _lock:
        still_used = []
        while _kept:
            iterator = _kept.pop()
            # References: `iterator` and getrefcount's argument; any more is a user of it.
            if sys.getrefcount(iterator) > 2:
                still_used.append(iterator)
            elif _release_thread().unfinished_tasks >= MAX_WAITING:
                here.append(iterator)
            else:
                _release_thread().put(iterator)
                handed += 1
            del iterator
        _kept.extend(reversed(still_used))
    del here
    return handed


def _release_thread() -> queue.Queue:
    global _released, _reaper
    if _reaper is None or not _reaper.is_alive():
        _released = queue.Queue()
        _reaper = threading.Thread(target=_drop_each, args=(_released,), name=REAPER_NAME,
                                   daemon=True)
        _reaper.start()
        # Registered now, after TensorFlow's own handlers: atexit runs this one before them.
        atexit.unregister(_release_all_at_exit)
        atexit.register(_release_all_at_exit)
    return _released


def _drop_each(released: queue.Queue) -> None:
    global _busy_since
    while True:
        iterator = released.get()
        if iterator is None:
            return
        _busy_since = time.monotonic()
        del iterator  # destroyed here, off the training thread
        _busy_since = None
        released.task_done()


def wait_released(timeout: float) -> bool:
    """Waits until every iterator handed to the release thread so far is destroyed.

    Returns:
        `False` if some were still waiting, or being destroyed, after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    released = _released
    while released is not None and released.unfinished_tasks:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def release_state() -> dict:
    """What the release thread is doing, for an error message: iterators kept, waiting, and
    the stack of the destruction in progress."""
    import traceback

    reaper, released, busy = _reaper, _released, _busy_since
    frame = sys._current_frames().get(reaper.ident) if reaper is not None else None
    return {"kept": len(_kept), "waiting": released.unfinished_tasks if released else 0,
            "busy_for_s": None if busy is None else round(time.monotonic() - busy, 1),
            "alive": bool(reaper and reaper.is_alive()), "stalled": _stalled,
            "stack": "".join(traceback.format_stack(frame)) if frame is not None else None}


def _release_all_at_exit() -> None:
    """Releases every kept iterator before TensorFlow is torn down, with a deadline."""
    with _lock:
        if not _kept and _reaper is None:
            return
        released = _release_thread()
        while _kept:
            released.put(_kept.pop())
        released.put(None)
        reaper = _reaper
    if not _stalled:  # a stalled thread would only delay the exit
        reaper.join(_EXIT_DEADLINE_S)


def keeps_iterator_on_training_thread() -> bool | None:
    return source_has(resolve("epoch iterator")._enumerate_iterator,
                      "self._current_iterator = iter(self._get_iterator())")


# --- The iterator Keras makes at an epoch's end for the next epoch, which never uses it ---


def patch_defer_epoch_end_iterator() -> Any:
    """Under a distributing strategy, the iterator Keras makes at an epoch's end is not made.

    Keras's `EpochIterator._enumerate_iterator` (3.10 to 3.15), with no `steps_per_epoch`,
    makes a fresh iterator at each epoch's start; and after an epoch's last batch it makes
    one more, for the next epoch, whose start replaces it unread (and a `fit`'s last epoch
    makes one nobody reads). A distributed iterator costs 70-250 ms to make on 2 workers
    sharing 2 cores (a MultiDeviceIterator: functions traced for its devices, a prefetch
    thread; `benchmarks/workers_vs_loop.py`'s model: 6 made per 3-epoch fit, 0.4 s of its
    5.5 s for the 3 unread). Here Keras is handed a placeholder for it, which raises if it
    is ever read (a Keras that reuses it: the `present` check then says so). Other
    strategies, and inputs with `steps_per_epoch` or of unknown length, keep Keras's.

    So do `tf.data` inputs (Keras's `TFDatasetAdapter`): each iterator made of a dataset
    that reshuffles (`shuffle(..., reshuffle_each_iteration=True)`, the default) draws
    the next order, so one made on one device and not here would leave every later
    epoch on another order than one device's (measured: 2 epochs on 2 devices 0.033 off
    one device's weights, 1.2e-7 with the iterator made).
    """
    from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing

    iterator_class = resolve("tensorflow epoch iterator")
    original = iterator_class._get_iterator

    def _get_iterator(self):
        if (self.steps_per_epoch is None and self._num_batches
                and self._steps_seen >= self._num_batches
                and distributing(self._distribute_strategy)
                and not may_reshuffle(self.data_adapter)):
            return _NotMade()  # after the last batch: the next epoch makes its own
        return original(self)

    iterator_class._get_iterator = _get_iterator
    return lambda: setattr(iterator_class, "_get_iterator", original)


def may_reshuffle(adapter: Any) -> bool:
    """Whether each iterator made of `adapter`'s data may draw a new order: a `tf.data` input."""
    return isinstance(adapter, resolve("tf dataset adapter"))


class _NotMade:
    """Stands for the iterator Keras makes after an epoch's last batch (never read)."""

    def __iter__(self) -> _NotMade:
        return self

    def __next__(self) -> Any:
        raise RuntimeError(
            "kmp.compat patch defer_epoch_end_iterator: Keras read the iterator it makes after "
            "an epoch's last batch, which kmp does not make (this Keras reuses it). Please "
            "report it, with your Keras version.")


def makes_unread_epoch_end_iterator() -> bool | None:
    """Whether Keras still makes a fresh iterator at every epoch's start without
    `steps_per_epoch`, and one after an epoch's last batch."""
    return source_has(resolve("epoch iterator")._enumerate_iterator,
                      "if self._current_iterator is None or self.steps_per_epoch is None:",
                      "if self._num_batches and self._steps_seen >= self._num_batches:\n"
                      "                self._current_iterator = iter(self._get_iterator())")
