"""TensorFlow patch: no per-step input check for executions of full batches on several workers.

Under MultiWorkerMirroredStrategy, a distributed iterator's
`get_next_as_optional` (what Keras's `steps_per_execution` loop fetches each
step with) always handles a partial last batch: one all-reduce across workers
per step counts the replicas that still have input, and a `tf.cond` fills in
dummy batches where one has none. Only an infinite dataset skips it. That is
one more cross-worker round trip per step, beside the gradients' all-reduce:
on 2 workers sharing 2 cores, 1-2 ms of a 13 ms step (TensorFlow 2.21).

For arrays, Keras knows how many full global batches an epoch has
(`ArrayDataAdapter.num_batches`, `has_partial_batch`), and every worker reads
the same number of them: Keras runs as many steps on each worker, and
`ArrayDataAdapter` shards by `DATA`, so each worker gets its share of every
global batch. `patch_full_batch_executions` records that count on each
distributed iterator `TFEpochIterator` makes of arrays under
MultiWorkerMirroredStrategy; kmp's `steps_per_execution` loop
(`_compat_trainer`) then asks `claim_full_batches(iterator, n)` before each
execution: while all of its n fetches are full batches, they go through
`_get_next_no_partial_batch_handling` (what TensorFlow does for infinite
datasets), with no collective. The execution that would reach the last batch,
and every one after it, keeps TensorFlow's check. Every worker counts the same
fetches, so all workers take the same path at each execution.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins._compat_checks import source_has

_FULL = "_kmp_full_batches_left"  # on a distributed iterator: full batches not fetched yet


def patch_full_batch_executions() -> Any:
    from keras.src.backend.tensorflow import trainer as tf_trainer
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    original = tf_trainer.TFEpochIterator._get_iterator

    def _get_iterator(self):
        dataset = original(self)
        strategy = self._distribute_strategy
        if (strategy is None or not tf_trainer._collective_all_reduce_multi_worker(strategy)
                or not isinstance(self.data_adapter, ArrayDataAdapter)):
            return dataset
        adapter = self.data_adapter
        return _Counted(dataset, adapter.num_batches - int(adapter.has_partial_batch))

    tf_trainer.TFEpochIterator._get_iterator = _get_iterator
    return lambda: setattr(tf_trainer.TFEpochIterator, "_get_iterator", original)


class _Counted:
    """What Keras iterates over (`iter(...)` only): each iterator carries its full batches."""

    def __init__(self, dataset: Any, full_batches: int) -> None:
        self._dataset = dataset
        self._full_batches = full_batches

    def __iter__(self) -> Any:
        iterator = iter(self._dataset)
        setattr(iterator, _FULL, self._full_batches)
        return iterator


def claim_full_batches(iterator: Any, n: int) -> bool:
    """Whether the next `n` fetches from `iterator` are full batches; if so, counts them.

    `False` for an iterator kmp did not count, and from the first execution that
    could reach past the full batches on: those keep TensorFlow's check.
    """
    left = getattr(iterator, _FULL, None)
    if left is None:
        return False
    if n <= left:
        setattr(iterator, _FULL, left - n)
        return True
    setattr(iterator, _FULL, None)
    return False


def fetch_full_batch(iterator: Any) -> Any:
    """The next element, as an Optional holding a value, without the cross-worker check."""
    import tensorflow as tf

    return tf.experimental.Optional.from_value(iterator._get_next_no_partial_batch_handling())


def checks_input_every_step() -> bool | None:
    """TensorFlow still checks across workers at every fetch (and can skip it); Keras still
    makes each epoch's iterator with `iter(self._get_iterator())`."""
    from keras.src.trainers import epoch_iterator
    from tensorflow.python.distribute import input_lib

    iterator = input_lib.DistributedIterator
    if not hasattr(iterator, "_get_next_no_partial_batch_handling"):
        return False
    found = (source_has(iterator.get_next_as_optional, "_calculate_replicas_with_values("),
             source_has(epoch_iterator.EpochIterator._enumerate_iterator,
                        "iter(self._get_iterator())"))
    if False in found:
        return False
    return None if None in found else True
