"""Keras patch: under tf.distribute, the loss scale skips a step when the global batch overflows."""

from __future__ import annotations

import functools
from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve

#: Smallest magnitude float16 rounds to inf (its largest finite value is 65504).
FLOAT16_OVERFLOW = 65520.0
#: Set on an inner optimizer while it applies gradients the loss-scale patch all-reduced.
_REDUCED = "_kmp_gradients_reduced"

# --- mixed precision: the loss scale's finiteness is one replica's, not the global batch's ---


def patch_loss_scale_finiteness() -> Any:
    """`LossScaleOptimizer` decides "skip this step" on one replica's local gradients.

    Under tf.distribute Keras's `_tf_apply` checks `isfinite` on the gradients
    before they are all-reduced and takes the first local replica's answer
    ("each replica computed the same value, since grads is all-reduced": they
    are not yet). When another replica overflowed, its inf/NaN gradients are
    all-reduced into every update, and the loss scale collapses; on several
    workers, each takes its own first replica's answer. And a replica's share
    of the batch can fit in float16 where the global batch's gradient does not
    (a float16 `x^T @ dy` over the whole batch is inf on one device, each half
    is finite and so is their float32 sum): one device skips the step, N
    replicas did not. The fix all-reduces the gradients first (the all-reduce
    the inner optimizer would run, which then runs none), so every replica and
    worker judges the same global gradient: not finite, or, for a variable its
    layer computes in float16 (its gradient is a cast from float16; a
    `dtype="float32"` layer's is not), a magnitude float16 rounds to inf. Then
    every replica's gradients are made NaN, so each skips the step and halves
    the scale as one device does. Finite gradients pass unchanged.
    """
    import tensorflow as tf

    loss_scale, tf_optimizer = resolve("loss scale optimizer"), resolve("tensorflow optimizer")
    original = loss_scale._tf_apply
    original_reduce = tf_optimizer._all_reduce_sum_gradients

    def _tf_apply(self, grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        if context is None or not distributing(tf.distribute.get_strategy()):
            return original(self, grads, trainable_variables)
        grads = list(grads)
        variables = list(trainable_variables if trainable_variables is not None
                         else self.inner_optimizer._trainable_variables)
        reduced = [g for g, _ in self.inner_optimizer._all_reduce_sum_gradients(
            list(zip(grads, variables, strict=True)))]
        finite = tf.logical_and(self.check_finite(reduced), fits_float16(grads, reduced))

        def poison(g):
            if g is None:
                return g
            if isinstance(g, tf.IndexedSlices):
                return tf.IndexedSlices(poison(g.values), g.indices, g.dense_shape)
            return tf.where(finite, g, tf.constant(float("nan"), g.dtype))

        setattr(self.inner_optimizer, _REDUCED, True)
        try:
            return original(self, [poison(g) for g in reduced], trainable_variables)
        finally:
            setattr(self.inner_optimizer, _REDUCED, False)

    @functools.wraps(original_reduce)  # `present` checks read Keras's source through it
    def _all_reduce_sum_gradients(self, grads_and_vars):
        if getattr(self, _REDUCED, False):  # already all-reduced by `_tf_apply` above
            return list(grads_and_vars)
        return original_reduce(self, grads_and_vars)

    loss_scale._tf_apply = _tf_apply
    tf_optimizer._all_reduce_sum_gradients = _all_reduce_sum_gradients

    def undo():
        loss_scale._tf_apply = original
        tf_optimizer._all_reduce_sum_gradients = original_reduce

    return undo


def fits_float16(local: list[Any], reduced: list[Any]) -> Any:
    """Whether every all-reduced gradient of a float16-computed variable is below float16's inf.

    A gradient counts as float16-computed when the replica's own gradient is a
    cast from float16 (the autocast variable of a `mixed_float16` layer).
    """
    import tensorflow as tf

    checks = [tf.constant(True)]
    for g, total in zip(local, reduced, strict=True):
        values = g.values if isinstance(g, tf.IndexedSlices) else g
        op = getattr(values, "op", None)
        if (op is None or op.type != "Cast" or tf.executing_eagerly()
                or op.inputs[0].dtype != tf.float16):
            continue
        total = total.values if isinstance(total, tf.IndexedSlices) else total
        checks.append(tf.reduce_all(tf.abs(total) < FLOAT16_OVERFLOW))
    return tf.reduce_all(tf.stack(checks))


def loss_scale_takes_first_replica() -> bool | None:
    method = resolve("loss scale optimizer").__dict__.get("_tf_apply")
    return None if method is None else source_has(
        method, "experimental_local_results", ")[0]", "check_finite")
