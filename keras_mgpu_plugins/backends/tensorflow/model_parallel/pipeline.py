"""The train step of a placed model: micro-batches, and gradients beside their forward ops.

Keras's own `train_step` takes gradients with a `tf.GradientTape`; the tape builds
the backward ops under the device scope in effect when `tape.gradient` is called (none),
so TensorFlow's placer puts the whole backward pass, and every weight gradient, on its
first device. This step asks for the gradients with
`tf.compat.v1.gradients(..., colocate_gradients_with_ops=True)` inside the traced step:
each gradient op runs on the device of the forward op it differentiates, so a stage's
backward pass, its activations and its weight gradients stay on the stage's device.

With `micro_batches=M` each global batch is split into M equal pieces along its first
axis; the pieces' losses are averaged (each piece's loss is its mean, so the average is
the full batch's mean) and one gradient is taken of that average. The pieces have no data
dependence on each other, so TensorFlow's executor runs stage k on piece j + 1 while stage
k + 1 runs piece j: a GPipe schedule with a bubble of (S - 1) / (M + S - 1).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins import compat
from keras_mgpu_plugins.backends.tensorflow.patches import functional_graph as private

logger = logging.getLogger("keras_mgpu_plugins")

#: The graph of each placed model's last traced train step (read by tests and debugging).
TRACED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def check_train_step(model: Any, micro_batches: int, factory_name: str) -> None:
    """Refuses `micro_batches` for a model whose class overrides `train_step`.

    Raises:
        ValueError: If it does and `micro_batches` is more than 1 (the pieces are split
            by kmp's step, which would replace the user's).
    """
    import keras

    if micro_batches > 1 and type(model).train_step is not keras.Model.train_step:
        raise ValueError(
            f"micro_batches={micro_batches} needs kmp's placed train step, but the factory "
            f"{factory_name} returned a {type(model).__name__}, which overrides train_step "
            "(kmp keeps it). Remove micro_batches, or drop the train_step override."
        )


def install_train_step(model: Any, micro_batches: int, loss_device: str | None) -> None:
    """Replaces `model.train_step` (on this instance) with the placed, micro-batched step.

    A model whose class overrides `train_step` keeps it: its forward pass, variables and
    optimizer slots are placed; its gradients run where TensorFlow's placer puts them.
    """
    import keras

    if type(model).train_step is not keras.Model.train_step:
        logger.warning(
            "model_parallel: %s overrides train_step; it is kept. Its layers, variables and "
            "optimizer slots are placed, but the gradients its tape computes run where "
            "TensorFlow places them (kmp's own step computes each beside its forward op).",
            type(model).__name__)
        return
    compat.apply_to("placed_train_step", model, micro_batches, loss_device)


def set_train_step(model: Any, micro_batches: int, loss_device: str | None) -> None:
    """The registered per-instance patch `placed_train_step`."""
    model.train_step = make_train_step(model, micro_batches, loss_device)


def make_train_step(model: Any, micro_batches: int, loss_device: str | None) -> Callable:
    import keras
    import tensorflow as tf

    def train_step(data: Any) -> Any:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        pieces = _split((x, y, sample_weight), micro_batches)
        tape = None if tf.inside_function() else tf.GradientTape()
        if tape is None:
            TRACED[model] = tf.compat.v1.get_default_graph()
        losses, preds = [], []
        with tape if tape is not None else _nothing():
            for xj, yj, wj in pieces:
                y_pred = model(xj, training=True) if private.call_has_training_arg(model) \
                    else model(xj)
                with tf.device(loss_device):
                    loss = private.compute_loss(model, xj, yj, y_pred, wj)
                    if model.optimizer is not None:
                        loss = model.optimizer.scale_loss(loss)
                losses.append(loss)
                preds.append(y_pred)
            with tf.device(loss_device):
                total = losses[0] if len(losses) == 1 else tf.add_n(losses) / len(losses)
        weights = model.trainable_weights
        if weights:
            if tape is not None:  # run_eagerly=True: Keras's way, backward not placed
                grads = tape.gradient(total, weights)
            else:
                grads = tf.compat.v1.gradients(
                    total, [w.value for w in weights], colocate_gradients_with_ops=True)
            model.optimizer.apply_gradients(zip(grads, weights, strict=True))
        metrics = None
        for (xj, yj, wj), y_pred in zip(pieces, preds, strict=True):
            metrics = model.compute_metrics(xj, yj, y_pred, sample_weight=wj)
        return metrics

    return train_step


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _split(data: Any, micro_batches: int) -> list[tuple[Any, Any, Any]]:
    """The batch as `micro_batches` equal pieces; an error if its rows do not divide."""
    import keras
    import tensorflow as tf

    if micro_batches == 1:
        return [data]
    flat = [t for t in keras.tree.flatten(data) if t is not None]
    rows = tf.shape(flat[0])[0]
    check = tf.debugging.assert_equal(
        rows % micro_batches, 0,
        message=(f"micro_batches={micro_batches} must divide every batch's rows; this batch's "
                 "rows do not divide (the last batch of an epoch is smaller unless the sample "
                 "count is a multiple of the batch size, or the dataset is batched with "
                 "drop_remainder=True)"),
    )
    pieces = []
    for t in keras.tree.flatten(data):
        if t is None:
            pieces.append([None] * micro_batches)
            continue
        with tf.control_dependencies([check]):
            pieces.append(tf.split(tf.identity(t), micro_batches, axis=0))
    return [keras.tree.pack_sequence_as(data, [p[j] for p in pieces])
            for j in range(micro_batches)]
