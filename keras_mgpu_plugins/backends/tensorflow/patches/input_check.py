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
the same number of steps: `ArrayDataAdapter` shards by `DATA`, so each worker
gets its share of every global batch. `patch_full_batch_executions` records
that count on each distributed iterator `TFEpochIterator` makes of arrays under
MultiWorkerMirroredStrategy; kmp's `steps_per_execution` loop
(`patches.trainer`) then asks `claim_full_batches(iterator, n, strategy)`
before each execution: while all of its n fetches are full batches, they go
through `_get_next_no_partial_batch_handling` (what TensorFlow does for
infinite datasets), with no collective. The execution that would reach the last
full batch, and every one after it, keeps TensorFlow's check. With one step per
execution, Keras's own step fetches with the check too (`get_next`); `single_steps`
runs each full batch's step without it, the logs reduced in the same call.

All workers must take the same path at each execution. At an iterator's first
execution the workers agree on the smallest count (one all-gather per
iterator, that is per epoch; 0 for inputs kmp does not count), so arrays of
different lengths on different workers (9 full batches and a partial one on
one worker, 10 full on another: the same number of steps) still agree.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require

_FULL = "_kmp_full_batches_left"  # on a distributed iterator: full batches not fetched yet
_LOCAL = "_kmp_full_batches_here"  # this worker's count, before the workers agreed


def patch_full_batch_executions() -> Any:
    iterator_class, array_adapter = resolve("tensorflow epoch iterator"), resolve("array data adapter")
    require("collective_all_reduce_multi_worker")
    require("distributed_input_lib")
    multi_worker = resolve("collective_all_reduce_multi_worker")
    original = iterator_class._get_iterator

    def _get_iterator(self):
        dataset = original(self)
        strategy = self._distribute_strategy
        if (strategy is None or not multi_worker(strategy)
                or not isinstance(self.data_adapter, array_adapter)):
            return dataset
        adapter = self.data_adapter
        return _Counted(dataset, adapter.num_batches - int(adapter.has_partial_batch))

    iterator_class._get_iterator = _get_iterator
    return lambda: setattr(iterator_class, "_get_iterator", original)


class _Counted:
    """What Keras iterates over (`iter(...)` only): each iterator carries its full batches."""

    def __init__(self, dataset: Any, full_batches: int) -> None:
        self._dataset = dataset
        self._full_batches = full_batches

    def __iter__(self) -> Any:
        iterator = iter(self._dataset)
        setattr(iterator, _LOCAL, self._full_batches)
        return iterator


def claim_full_batches(iterator: Any, n: int, strategy: Any) -> bool:
    """Whether the next `n` fetches from `iterator` are full batches on every worker.

    If so, counts them. `False` under a strategy that does not span workers,
    for inputs kmp did not count on some worker, and from the first execution
    that could reach past the full batches on: those keep TensorFlow's check.
    The first call for an iterator agrees on the count across workers (a
    collective: every worker calls this at the same execution).
    """
    from keras_mgpu_plugins.backends.tensorflow import collective

    if not collective.spans_workers(strategy):
        return False
    if not hasattr(iterator, _FULL):
        here = getattr(iterator, _LOCAL, 0)
        agreed = int(collective.all_gather([here], strategy).min())
        setattr(iterator, _FULL, agreed)
    left = getattr(iterator, _FULL)
    if n <= left:
        setattr(iterator, _FULL, left - n)
        return True
    setattr(iterator, _FULL, 0)
    return False


def fetch_full_batch(iterator: Any) -> Any:
    """The next element, as an Optional holding a value, without the cross-worker check."""
    import tensorflow as tf

    return tf.experimental.Optional.from_value(iterator._get_next_no_partial_batch_handling())


def single_steps(model: Any, keras_function: Any, step_function: Any) -> Any:
    """`steps_per_execution=1` on several workers (what `patches.trainer` makes of Keras's
    `function` there): one traced step whose fetch is a `tf.cond` on whether the batch is a
    full one kmp counted (`claim_full_batches`, a tensor: one trace for both), fetched
    without TensorFlow's cross-worker input check, else with it (`get_next`, as Keras); the
    logs reduced in the same call. Keras's own step fetches every batch with the check: one
    more all-reduce per step than the gradients' and the logs' (measured, 2 workers sharing
    2 cores: 0.7x the samples/s of the hand-written loop, which has none). Inputs other than
    a distributed iterator run Keras's `function`."""
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow import collective

    strategy = model.distribute_strategy
    if not collective.spans_workers(strategy):
        return keras_function
    tf_trainer = resolve("tensorflow trainer module")
    autoconvert = getattr(model, "_autoconvert_optionals", lambda f: f)
    step = autoconvert(tf.function(lambda data: strategy.run(step_function, args=(data,)),
                                   reduce_retracing=True, jit_compile=model.jit_compile))

    def one_step(iterator, full):
        data = tf.cond(full, lambda: fetch_full_batch(iterator).get_value(), iterator.get_next)
        return tf_trainer.reduce_per_replica(step(data), strategy, reduction="auto")

    traced = tf.function(tf.autograph.experimental.do_not_convert(one_step),
                         reduce_retracing=True)

    def function(iterator):
        if not isinstance(iterator, tf.distribute.DistributedIterator):
            return keras_function(iterator)
        return traced(iterator, tf.constant(claim_full_batches(iterator, 1, strategy)))

    function._kmp_single_step = traced  # for tests: the traced step
    return function


def checks_input_every_step() -> bool | None:
    """TensorFlow still checks across workers at every fetch (and can skip it); Keras still
    makes each epoch's iterator with `iter(self._get_iterator())`."""
    iterator = resolve("distributed iterator")
    if not hasattr(iterator, "_get_next_no_partial_batch_handling"):
        return False
    found = (source_has(iterator.get_next_as_optional, "_calculate_replicas_with_values("),
             source_has(resolve("epoch iterator")._enumerate_iterator,
                        "iter(self._get_iterator())"))
    if False in found:
        return False
    return None if None in found else True
