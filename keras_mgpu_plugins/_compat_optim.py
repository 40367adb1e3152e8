"""Keras patches for optimizer settings under tf.distribute: gradient clipping, EMA overwrite.

`patch_clip_after_all_reduce` clips the all-reduced gradient, as one device
clips the global batch's (no keras-team/keras issue found; the closest is
tensorflow/tensorflow#33929, where tf.keras refused clipping under a strategy); `overwrite_with_ema` runs the EMA overwrite's `cond` in the
cross-replica context. Both apply only under a strategy that spans replicas or
workers (`distributing`); one device keeps Keras's code.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins._compat_checks import source_has
from keras_mgpu_plugins._compat_trainer import distributing


def clips(optimizer: Any) -> bool:
    """Whether `optimizer` clips gradients (`clipnorm`, `global_clipnorm` or `clipvalue`)."""
    return any(getattr(optimizer, name, None) and getattr(optimizer, name) > 0
               for name in ("clipnorm", "global_clipnorm", "clipvalue"))


def patch_clip_after_all_reduce() -> Any:
    """`clipnorm`, `global_clipnorm` and `clipvalue` clip each replica's gradient.

    Upstream's `_backend_apply_gradients` clips the gradients it is given, in
    the replica context, and `_backend_update_step` all-reduces them after:
    N replicas sum N clipped partial gradients, where one device clips the
    global batch's gradient (clipping does not commute with the sum, for
    `clipvalue` neither). Under a distributing strategy, with clipping set and
    no accumulation (`patch_gradient_accumulation` clips its own way), the
    gradients are all-reduced first, then clipped (every replica holds the same
    sum, so every replica clips the same way), then weight decay and the update
    run as upstream's, without a second all-reduce. The EMA update and its
    overwrite follow (`overwrite_with_ema`).
    """
    import tensorflow as tf
    from keras.src import backend
    from keras.src.backend.tensorflow import optimizer as tf_optimizer

    original = tf_optimizer.TFOptimizer._backend_apply_gradients

    def _backend_apply_gradients(self, grads, trainable_variables):
        context = tf.distribute.get_replica_context()
        strategy = self._distribution_strategy
        if (self.gradient_accumulation_steps or context is None or not distributing(strategy)
                or not (clips(self) or (self.use_ema and self.ema_overwrite_frequency))):
            return original(self, grads, trainable_variables)
        if clips(self):
            pairs = self._all_reduce_sum_gradients(list(zip(grads, trainable_variables, strict=True)))
            grads = self._clip_gradients([g for g, _ in pairs])
            self._apply_weight_decay(trainable_variables)
            variables = [v.value if isinstance(v, backend.Variable) else v
                         for v in trainable_variables]
            tf.__internal__.distribute.interim.maybe_merge_call(
                self._distributed_tf_update_step, strategy,
                list(zip(grads, variables, strict=True)), self.learning_rate)
        else:
            self._apply_weight_decay(trainable_variables)
            self._backend_update_step(grads, trainable_variables, self.learning_rate)
        if self.use_ema:
            self._update_model_variables_moving_average(self._trainable_variables)
            overwrite_with_ema(self, context)

    tf_optimizer.TFOptimizer._backend_apply_gradients = _backend_apply_gradients
    return lambda: setattr(tf_optimizer.TFOptimizer, "_backend_apply_gradients", original)


def overwrite_with_ema(optimizer: Any, context: Any) -> None:
    """Every `ema_overwrite_frequency` updates, the model's variables take their averages.

    Upstream tests this with a `cond` in the replica context whose branch
    updates mirrored variables (a `merge_call`), which TensorFlow refuses
    there. The `cond` runs in the cross-replica context instead, on the
    iteration count every replica and worker shares.
    """
    import tensorflow as tf

    if not optimizer.ema_overwrite_frequency:
        return

    def cross_replica(distribution):
        def overwrite():
            optimizer._overwrite_model_variables_with_average_value(optimizer._trainable_variables)
            return tf.constant(True)

        tf.cond(tf.equal((optimizer.iterations + 1) % optimizer.ema_overwrite_frequency, 0),
                overwrite, lambda: tf.constant(False))

    context.merge_call(cross_replica)


def clips_before_all_reduce() -> bool | None:
    from keras.src.optimizers import base_optimizer

    return source_has(base_optimizer.BaseOptimizer._backend_apply_gradients,
                      "grads = self._clip_gradients(grads)", "self._backend_update_step(")
