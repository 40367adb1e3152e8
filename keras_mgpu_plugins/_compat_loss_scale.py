"""Keras patch: under tf.distribute, the loss scale skips a step when any replica overflowed."""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins._compat_checks import source_has
from keras_mgpu_plugins._compat_trainer import distributing

# --- mixed precision: the loss scale's finiteness is one replica's, not the global batch's ---


def patch_loss_scale_finiteness() -> Any:
    """`LossScaleOptimizer` decides "skip this step" on one replica's local gradients.

    Under tf.distribute Keras's `_tf_apply` checks `isfinite` on the gradients
    before they are all-reduced and takes the first local replica's answer
    ("each replica computed the same value, since grads is all-reduced": they
    are not yet). When another replica overflowed, its inf/NaN gradients are
    all-reduced into every update, and the loss scale collapses; on several
    workers, each takes its own first replica's answer. One device skips the
    step whenever the global batch's gradient overflows. The fix agrees across
    every replica and worker first (one scalar all-reduce) and, if any replica
    overflowed, makes every replica's gradients NaN, so each skips the step
    and halves the scale as one device does. Finite gradients pass unchanged.
    """
    import tensorflow as tf
    from keras.src.optimizers import loss_scale_optimizer as lso

    original = lso.LossScaleOptimizer._tf_apply

    def _tf_apply(self, grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        if context is None or not distributing(tf.distribute.get_strategy()):
            return original(self, grads, trainable_variables)
        local_bad = tf.cast(tf.logical_not(self.check_finite(grads)), tf.float32)
        finite = tf.equal(context.all_reduce("SUM", local_bad), 0.0)

        def poison(g):
            if g is None:
                return g
            if isinstance(g, tf.IndexedSlices):
                return tf.IndexedSlices(poison(g.values), g.indices, g.dense_shape)
            return tf.where(finite, g, tf.constant(float("nan"), g.dtype))

        return original(self, [poison(g) for g in grads], trainable_variables)

    lso.LossScaleOptimizer._tf_apply = _tf_apply
    return lambda: setattr(lso.LossScaleOptimizer, "_tf_apply", original)


def loss_scale_takes_first_replica() -> bool | None:
    from keras.src.optimizers import loss_scale_optimizer as lso

    method = lso.LossScaleOptimizer.__dict__.get("_tf_apply")
    return None if method is None else source_has(
        method, "experimental_local_results", ")[0]", "check_finite")
