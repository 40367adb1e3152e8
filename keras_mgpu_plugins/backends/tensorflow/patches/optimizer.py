"""Keras patches for optimizer settings under tf.distribute: clipping, EMA, sparse gradients.

`patch_clip_after_all_reduce` clips the all-reduced gradient, as one device
clips the global batch's (no keras-team/keras issue found; the closest is
tensorflow/tensorflow#33929, where tf.keras refused clipping under a strategy);
`overwrite_with_ema` runs the EMA overwrite's `cond` in the cross-replica context
where Keras does not (Keras 3.15 runs it in the replica context, which TensorFlow
refuses; keras-nightly 3.16.0.dev's TensorFlow optimizer runs it cross-replica itself,
`_backend_maybe_overwrite_model_variables`, and is left to it). Both apply only under
a strategy that spans replicas or workers (`distributing`); one device keeps Keras's code.
`patch_sum_duplicate_slices` sums the slices of a sparse gradient that share a
row before the update, under a distributing strategy and for the models
`kmp.parallelize` builds on one device (`mark_sums_duplicate_slices`).
"""

from __future__ import annotations

import functools
from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require


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
    overwrite follow (`overwrite_with_ema`). Without clipping, a Keras whose
    overwrite runs in the replica context (`ema_overwrite_in_replica_context`)
    has its overwrite taken over the same way; a Keras that runs it
    cross-replica itself keeps its own code.
    """
    import tensorflow as tf

    variable_class, tf_optimizer = resolve("backend variable"), resolve("tensorflow optimizer")
    original = tf_optimizer._backend_apply_gradients
    ema_fix_needed = ema_overwrite_in_replica_context()

    def _backend_apply_gradients(self, grads, trainable_variables):
        context = tf.distribute.get_replica_context()
        strategy = self._distribution_strategy
        overwrites = self.use_ema and self.ema_overwrite_frequency and ema_fix_needed
        if (self.gradient_accumulation_steps or context is None or not distributing(strategy)
                or not (clips(self) or overwrites)):
            return original(self, grads, trainable_variables)
        if clips(self):
            pairs = self._all_reduce_sum_gradients(list(zip(grads, trainable_variables, strict=True)))
            grads = self._clip_gradients([g for g, _ in pairs])
            self._apply_weight_decay(trainable_variables)
            variables = [v.value if isinstance(v, variable_class) else v
                         for v in trainable_variables]
            require("tf_maybe_merge_call")
            resolve("maybe_merge_call")(
                self._distributed_tf_update_step, strategy,
                list(zip(grads, variables, strict=True)), self.learning_rate)
        else:
            self._apply_weight_decay(trainable_variables)
            self._backend_update_step(grads, trainable_variables, self.learning_rate)
        if self.use_ema:
            self._update_model_variables_moving_average(self._trainable_variables)
            overwrite_with_ema(self, context)

    tf_optimizer._backend_apply_gradients = _backend_apply_gradients
    return lambda: setattr(tf_optimizer, "_backend_apply_gradients", original)


def overwrite_with_ema(optimizer: Any, context: Any) -> None:
    """Every `ema_overwrite_frequency` updates, the model's variables take their averages.

    Keras 3.15 tests this with a `cond` in the replica context whose branch
    updates mirrored variables (a `merge_call`), which TensorFlow refuses
    there. The `cond` runs in the cross-replica context instead, on the
    iteration count every replica and worker shares. A Keras that does so
    itself (`_backend_maybe_overwrite_model_variables`) runs its own.
    """
    import tensorflow as tf

    if not optimizer.ema_overwrite_frequency:
        return
    if not ema_overwrite_in_replica_context():
        optimizer._backend_maybe_overwrite_model_variables(optimizer._trainable_variables)
        return

    def cross_replica(distribution):
        def overwrite():
            optimizer._overwrite_model_variables_with_average_value(optimizer._trainable_variables)
            return tf.constant(True)

        tf.cond(tf.equal((optimizer.iterations + 1) % optimizer.ema_overwrite_frequency, 0),
                overwrite, lambda: tf.constant(False))

    context.merge_call(cross_replica)


def clips_before_all_reduce() -> bool | None:
    return source_has(resolve("base optimizer")._backend_apply_gradients,
                      "grads = self._clip_gradients(grads)", "self._backend_update_step(")


def ema_overwrite_in_replica_context() -> bool:
    """Whether Keras's TensorFlow optimizer leaves the EMA overwrite's `cond` in the replica
    context (Keras 3.15), rather than running it cross-replica itself (keras-nightly
    3.16.0.dev: `_backend_maybe_overwrite_model_variables`, with a `merge_call`)."""
    own = vars(resolve("tensorflow optimizer")).get("_backend_maybe_overwrite_model_variables")
    return own is None or source_has(own, "merge_call") is False


#: Set on an optimizer whose sparse gradients are summed per row on one device as well.
SUMS_DUPLICATE_SLICES = "_kmp_sums_duplicate_slices"


def mark_sums_duplicate_slices(optimizer: Any) -> None:
    """`optimizer` (and a `LossScaleOptimizer`'s inner one) sums duplicate slices on one device."""
    for each in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if each is not None:
            setattr(each, SUMS_DUPLICATE_SLICES, True)


def sum_duplicate_slices(gradient: Any) -> Any:
    """A `tf.IndexedSlices` with one slice per row (the sum of that row's slices); else as given."""
    import tensorflow as tf

    if not isinstance(gradient, tf.IndexedSlices):
        return gradient
    rows, positions = tf.unique(gradient.indices)
    values = tf.math.unsorted_segment_sum(gradient.values, positions, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, gradient.dense_shape)


def patch_sum_duplicate_slices() -> Any:
    """Sparse gradients reach Adam, AdamW, RMSprop... with one slice per row.

    A gather's gradient (an `Embedding`) is a `tf.IndexedSlices` that may name
    a row several times. Keras 3's TensorFlow optimizers take it as it is:
    `ops.square(gradient)` squares each slice before they are added into the
    second moment, so a row's two slices a, b give a^2 + b^2 where the dense
    gradient gives (a + b)^2 (tf.keras summed them first,
    `_deduplicate_indexed_slices`; Keras's JAX backend sums duplicates before a
    non-linear op). The cross-replica SUM of `IndexedSlices` concatenates the
    replicas' slices, so N replicas give every row of a lookup shared by the
    batch (a position embedding of `arange(maxlen)`) N slices where one device
    has one: 1.3e-2 off one device after 8 steps with Adam. After the
    all-reduce, before clipping and the update, each sparse gradient's slices
    are summed per row (`tf.unique`, `unsorted_segment_sum`): N replicas then
    update as the dense gradient does, as one device does for such a lookup.
    A lookup of repeated tokens has duplicate rows on one device already; the
    models `kmp.parallelize` builds on one device are summed too, so one device
    and N devices agree for every lookup (plain Keras on one device does not
    sum: see docs/distribution_matrix.md). SGD is linear: unchanged.
    """
    tf_optimizer = resolve("tensorflow optimizer")
    original = tf_optimizer._all_reduce_sum_gradients

    @functools.wraps(original)  # `present` checks read Keras's source through it
    def _all_reduce_sum_gradients(self, grads_and_vars):
        reduced = original(self, grads_and_vars)
        if not (getattr(self, SUMS_DUPLICATE_SLICES, False)
                or distributing(self._distribution_strategy)):
            return reduced
        return [(sum_duplicate_slices(g), v) for g, v in reduced]

    tf_optimizer._all_reduce_sum_gradients = _all_reduce_sum_gradients
    return lambda: setattr(tf_optimizer, "_all_reduce_sum_gradients", original)


def keeps_duplicate_slices() -> bool | None:
    method = resolve("tensorflow optimizer").__dict__.get("_all_reduce_sum_gradients")
    if method is None:
        return None
    keeps = source_has(method, "all_reduce(")
    return None if keeps is None else keeps and not source_has(method, "unique")
