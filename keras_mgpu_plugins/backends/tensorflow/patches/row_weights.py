"""Keras patch: under tf.distribute, each replica's loss counts its rows, not 1/replicas.

Keras's TensorFlow trainer has each replica compute its loss as the mean over
its own rows, then scales it by 1/replicas (`scale_loss_for_distribution`), so
that the gradients summed over replicas are the global batch's mean. That holds
only when every replica holds as many rows. A global batch that does not split
evenly (31 rows on 2 replicas: 16 and 15; the partial last batch of 21 rows
in 8s: 3 and 2; 1 row on 2 replicas: 1 and none) then trains on the average of
the replicas' means: measured 9.6e-3 off one device on the weights after 2
epochs of 21 rows in 8s, and a data set of 1 row trains at half the gradient.

Under a distributing strategy, a step whose global batch may not split evenly
weighs each replica's loss by its rows over the global batch's
(`all_reduce` of the row counts: one scalar collective per step), which is the
torch lane's rule: the sum over replicas is then one device's loss, for every
split, a replica of 0 rows included. Keras's own unscaling (the loss it logs,
weighted by rows) divides by the same weight. An iterator `TFEpochIterator`
makes of inputs whose every global batch divides evenly over the replicas
(arrays; a `tf.data` dataset of a static batch size) keeps Keras's step as
it is, at no cost per step: the workers agree on that once per iterator. In a
weighted step, the metric results the step reads (its logs) are read from the
state summed over the replicas (`global_results`): each replica's own are the
mean of its own rows, and their mean across replicas is not one device's.
"""

from __future__ import annotations

import threading
from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve

_EVEN = "_kmp_even_batches"  # on a distributed iterator: its global batches split evenly
_AGREED = "_kmp_even_batches_agreed"  # the same, once every worker agreed
_state = threading.local()  # .weight: while a replica's step runs (MirroredStrategy: a thread each)


def current_weight() -> Any:
    """This replica's rows over the global batch's (a scalar tensor) while its weighted step
    runs; `None` elsewhere (Keras's 1/replicas)."""
    return getattr(_state, "weight", None)


class weighted:  # noqa: N801 - used as a context manager, like a function
    """Within it, this thread's replica loss weight is `weight` (`None`: Keras's)."""

    def __init__(self, weight: Any) -> None:
        self._weight = weight

    def __enter__(self) -> None:
        self._previous = current_weight()
        _state.weight = self._weight

    def __exit__(self, *exc: Any) -> None:
        _state.weight = self._previous


def patch_row_weighted_losses() -> Any:
    """Scales each replica's loss by its rows over the global batch's where batches may be uneven."""
    import tensorflow as tf

    loss_module, trainer = resolve("loss module"), resolve("tensorflow trainer")
    iterator_class = resolve("tensorflow epoch iterator")
    scale, unscale = loss_module.scale_loss_for_distribution, loss_module.unscale_loss_for_distribution
    make_function, get_iterator = trainer._make_function, iterator_class._get_iterator

    def scale_loss_for_distribution(value):
        weight = current_weight()
        return scale(value) if weight is None else value * tf.cast(weight, value.dtype)

    def unscale_loss_for_distribution(value):
        weight = current_weight()
        return (unscale(value) if weight is None
                else tf.math.divide_no_nan(value, tf.cast(weight, value.dtype)))

    def _make_function(self, step_function):
        if not distributing(self.distribute_strategy):
            return make_function(self, step_function)
        even, made = make_function(self, step_function), []
        strategy = self.distribute_strategy

        def function(iterator):
            if agreed_even(iterator, strategy):
                return even(iterator)
            if not made:  # traced at the first uneven call only
                made.append(make_function(self, rows_weighted(step_function, self)))
            return made[0](iterator)

        function.__dict__.update(getattr(even, "__dict__", {}))  # e.g. `_kmp_step_loop` (tests)
        function._kmp_weighted = made  # for tests: the weighted function, once made
        return function

    def _get_iterator(self):
        dataset = get_iterator(self)
        strategy = self._distribute_strategy
        if strategy is None or not distributing(strategy):
            return dataset
        return _Tagged(dataset, even_batches(self.data_adapter, strategy.num_replicas_in_sync))

    loss_module.scale_loss_for_distribution = scale_loss_for_distribution
    loss_module.unscale_loss_for_distribution = unscale_loss_for_distribution
    trainer._make_function = _make_function
    iterator_class._get_iterator = _get_iterator

    def undo():
        loss_module.scale_loss_for_distribution = scale
        loss_module.unscale_loss_for_distribution = unscale
        trainer._make_function = make_function
        iterator_class._get_iterator = get_iterator

    return undo


def even_batches(adapter: Any, replicas: int) -> bool:
    """Whether every global batch `adapter` gives splits into `replicas` equal parts.

    Known for inputs of a known batch size: arrays (their partial last batch too), a
    `tf.data` dataset whose batch dimension is static (every batch has it). Any other
    input (a generator, a `PyDataset`, a dataset of a dynamic batch size) may be uneven.
    """
    batch = getattr(adapter, "batch_size", None)
    if not isinstance(batch, int) or batch <= 0 or batch % replicas:
        return False
    partial = adapter.has_partial_batch
    if partial is None:  # unknown, unless the batch size is the dataset's static dimension
        return isinstance(adapter, resolve("tf dataset adapter"))
    return not partial or (adapter.partial_batch_size or 0) % replicas == 0


class _Tagged:
    """What Keras iterates over (`iter(...)` only): each iterator says whether it is even."""

    def __init__(self, dataset: Any, even: bool) -> None:
        self._dataset, self._even = dataset, even

    def __iter__(self) -> Any:
        iterator = iter(self._dataset)
        setattr(iterator, _EVEN, self._even)
        return iterator


def agreed_even(iterator: Any, strategy: Any) -> bool:
    """Whether every worker's `iterator` gives even global batches (an all-gather across
    workers at its first call, where the strategy spans workers: every worker makes that
    call at the same step). `False` for an iterator kmp did not tag."""
    from keras_mgpu_plugins.backends.tensorflow import collective

    agreed = getattr(iterator, _AGREED, None)
    if agreed is not None:
        return agreed
    here = getattr(iterator, _EVEN, None)
    if here is None:
        return False
    agreed = here
    if collective.spans_workers(strategy):
        agreed = bool(collective.all_gather([int(here)], strategy).min())
    setattr(iterator, _AGREED, agreed)
    return agreed


def rows_weighted(step_function: Any, model: Any = None) -> Any:
    """`step_function` with this replica's loss weighted by its rows over the global batch's.

    The weight comes from a collective (the sum of the replicas' rows), which cannot
    run inside XLA: `patches.compile_settings` compiles `step.unweighted` and calls
    `step.weight_of(data)` outside it. The results of `model`'s metrics read in the
    step (what its logs are) are the global batch's (`global_results`).
    """

    def step(data):
        with weighted(weight_of(data)), global_results(model):
            return step_function(data)

    step.unweighted = step_function
    step.weight_of = weight_of
    return step


class global_results:  # noqa: N801 - used as a context manager, like a function
    """Within it, `result()` of each of `model.metrics`, read in a replica's step, is the
    result of the state summed over the replicas (one all-reduce per result read).

    A metric's state is each replica's own (variables synchronized on read); a step's logs
    read its result in the replica, and Keras logs their mean across replicas: the mean of
    the replicas' means, one device's only where every replica counted as many rows (for a
    custom `train_step`'s `{m.name: m.result() ...}` that is the History too, not only the
    batch logs). Where batches may be uneven, each result is read from the summed state.
    """

    def __init__(self, model: Any) -> None:
        self._metrics = list(getattr(model, "metrics", None) or ()) if model is not None else []

    def __enter__(self) -> None:
        for metric in self._metrics:
            object.__setattr__(metric, "result", _global_result(metric))

    def __exit__(self, *exc: Any) -> None:
        for metric in self._metrics:
            metric.__dict__.pop("result", None)


def _global_result(metric: Any) -> Any:
    import keras
    import tensorflow as tf

    ops = {"sum": tf.distribute.ReduceOp.SUM, "mean": tf.distribute.ReduceOp.MEAN}

    def result():
        context = tf.distribute.get_replica_context()
        variables = list(metric.variables)
        reduced = [i for i, v in enumerate(variables) if getattr(v, "aggregation", None) in ops]
        if context is None or not reduced:
            return type(metric).result(metric)
        values = [tf.convert_to_tensor(v.value) for v in variables]
        for op in sorted({variables[i].aggregation for i in reduced}):  # one collective a kind
            which = [i for i in reduced if variables[i].aggregation == op]
            for i, value in zip(which, all_reduce(ops[op], [values[i] for i in which]),
                                strict=True):
                values[i] = value
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return type(metric).result(metric)

    return result


def weight_of(data: Any) -> Any:
    """This replica's rows (its batch's first input) over the sum of every replica's."""
    import keras
    import tensorflow as tf

    x = keras.utils.unpack_x_y_sample_weight(data)[0]
    first = next(t for t in keras.tree.flatten(x) + keras.tree.flatten(data) if t is not None)
    rows = tf.cast(tf.shape(first)[0], tf.float32)
    total = all_reduce(tf.distribute.ReduceOp.SUM, [rows])[0]
    return tf.math.divide_no_nan(rows, total)


def all_reduce(op: Any, values: list[Any]) -> list[Any]:
    """`values` all-reduced across the replicas, from a replica's step (one collective).

    TensorFlow reduces a tensor to its own device: a tensor of no device (the step of
    one device per worker that `patches.input_check.single_steps` traces) fails with
    "destinations can not be empty"; it is placed on the worker's one device first.
    """
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    devices = tf.distribute.get_strategy().extended.worker_devices
    if len(devices) == 1 and any(not v.device for v in values):
        with tf.device(devices[0]):
            values = [tf.identity(v) for v in values]
    return context.all_reduce(op, values)


def scales_by_replicas() -> bool | None:
    """Keras still scales a replica's loss by 1/replicas, and its train_step still logs the
    unscaled loss weighted by the replica's rows (what the unscaling here keeps right).
    Raises where the dataset adapter `even_batches` asks for is gone (cannot tell)."""
    resolve("tf dataset adapter")
    found = (source_has(resolve("loss module"), "1.0 / num_replicas"),
             source_has(resolve("tensorflow trainer module"),
                        "unscale_loss_for_distribution(loss)", "sample_weight=tf.shape("))
    if False in found:
        return False
    return None if None in found else True
