"""A small training script with one case per way N devices can train otherwise than one
device, and per way a script cannot be compared: the scripts `tests/verify` hands to
`kmp-verify` (`python tests/verify/cases.py CASE`), on every backend.

Cases built to differ (the cause the report must name, `DIFFERING`): BatchNormalization
without sync_batchnorm; a custom train_step whose loss is not scaled for the global batch;
a loss divided by each replica's own sample weights (reduction="mean_with_sample_weight",
the weights unequal between the halves of each batch); a logged value that no metric
reduces; Dropout drawing per replica; mixed precision; an Embedding whose rows each batch
repeats, trained by a second Adam of the step's own (kmp sums a repeated row's slices
after the replicas' all-reduce for every optimizer, on one device for the compiled one
only: this one squares each slice there). `sum_loss` (reduction="sum") is equal
on TensorFlow (the replicas' sums add up to one device's). Cases that cannot be compared (`CANNOT`): no fit, an undecorated model,
`random.Random()` without a seed, data seeded from the clock, a batch size that grows
with the devices. `plain` (and `sync_batchnorm`, `dropout_one_device`) must be equal; `uncovered` (a layer of
one's own drawing through `keras.random.shuffle`) is compared with that layer turned off.
"""

from __future__ import annotations

import os
import random
import sys
import time

import numpy as np

ROWS, FEATURES, BATCH = 96, 6, 16

#: The cause `kmp-verify` must name for each case built to differ.
DIFFERING = {"batchnorm": "batchnorm", "train_step": "train_step", "weighted_loss": "loss",
             "metric": "metric", "dropout": "random_layers", "mixed": "loss_scale",
             "embedding": "embedding"}
#: Words the reason of each case that cannot be compared must hold.
CANNOT = {"no_fit": "never called fit", "undecorated": "did not build",
          "unseeded": "random.Random() without a seed", "clock": "the clock",
          "batch_grows": "batch_size"}


def data(case: str):
    if case == "unseeded":
        rng = np.random.default_rng(random.Random().randrange(2**31))
    elif case == "clock":
        rng = np.random.default_rng(int(time.time() * 1e6) % 2**31)
    else:
        rng = np.random.default_rng(0)
    if case == "embedding":  # token ids: each batch repeats rows of the table
        x = rng.integers(0, 5, size=(ROWS, FEATURES)).astype("int32")
    else:
        x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = (np.asarray(x, "float32") @ rng.normal(size=(FEATURES, 1))).astype("float32")
    return x, y


def build(case: str):
    import keras

    keras.utils.set_random_seed(3)
    keras.mixed_precision.set_global_policy("mixed_float16" if case == "mixed" else "float32")
    inputs = keras.Input((FEATURES,), dtype="int32" if case == "embedding" else "float32")
    hidden = inputs
    if case == "embedding":
        hidden = keras.layers.Flatten()(keras.layers.Embedding(5, 4, name="table")(hidden))
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(hidden)
    if case in ("batchnorm", "sync_batchnorm"):
        hidden = keras.layers.BatchNormalization(name="norm")(hidden)
    if case in ("dropout", "dropout_one_device"):
        hidden = keras.layers.Dropout(0.5, name="drop")(hidden)
    if case == "uncovered":  # a random layer drawing through keras.random.shuffle
        hidden = _shuffled()(hidden)
    outputs = keras.layers.Dense(1, name="out", dtype="float32")(hidden)
    model_class = _custom_class(case) if case in ("train_step", "metric", "embedding") \
        else keras.Model
    model = model_class(inputs, outputs)
    optimizer = keras.optimizers.SGD(0.05)
    if case == "embedding":  # the table's rows by an optimizer of the step's own
        optimizer = keras.optimizers.Adam(0.05)
        model.second = keras.optimizers.Adam(0.05)
        model.second.build(model.trainable_variables[:1])
    loss = "mse"
    if case in ("sum_loss", "weighted_loss"):
        reduction = "sum" if case == "sum_loss" else "mean_with_sample_weight"
        loss = keras.losses.MeanSquaredError(reduction=reduction)
    model.compile(optimizer=optimizer, loss=loss, metrics=["mae"])
    return model


def _shuffled():
    """A random layer of one's own that permutes its features (keras.random.shuffle: a draw
    kmp cannot make as one device draws it)."""
    import keras

    class ShuffleFeatures(keras.layers.Layer):
        def __init__(self):
            super().__init__(name="shuffle_features")
            self.seed_generator = keras.random.SeedGenerator(5)

        def call(self, x, training=False):
            if not training:
                return x
            return keras.random.shuffle(x, axis=1, seed=self.seed_generator)

    return ShuffleFeatures()


def _custom_class(case: str):
    """A model class with keras.io's custom train_step (TensorFlow: GradientTape; torch:
    backward), for `train_step` (its loss a sum over the replica's rows), `metric` (a
    logged value no metric reduces) and `embedding` (the table's rows by a second
    optimizer of the step's own)."""
    import keras

    class Custom(keras.Model):
        def train_step(self, data):
            x, y = data
            if keras.backend.backend() == "torch":
                grads, loss, pred = self._torch_gradients(x, y)
            else:
                grads, loss, pred = self._tf_gradients(x, y)
            variables = list(self.trainable_variables)
            if case == "embedding":  # the table's rows by the step's own optimizer
                self.second.apply(grads[:1], variables[:1])
                grads, variables = grads[1:], variables[1:]
            self._apply(grads, variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, pred)
            logs = {m.name: m.result() for m in self.metrics}
            if case == "metric":
                logs["largest_error"] = keras.ops.max(keras.ops.abs(pred - y))
            return logs

        def _loss(self, x, y, pred):
            if case == "train_step" and keras.backend.backend() == "torch":
                # a sum over this process's rows: kmp averages the processes' gradients
                return keras.ops.sum(keras.ops.square(pred - y)) / 8.0
            if case == "train_step":  # a mean over this replica's rows: TensorFlow sums
                return keras.ops.mean(keras.ops.square(pred - y))  # the replicas' gradients
            return self.compute_loss(x=x, y=y, y_pred=pred)

        def _tf_gradients(self, x, y):
            import tensorflow as tf

            with tf.GradientTape() as tape:
                pred = self(x, training=True)
                loss = self._loss(x, y, pred)
            return tape.gradient(loss, self.trainable_variables), loss, pred

        def _torch_gradients(self, x, y):
            self.zero_grad()
            pred = self(x, training=True)
            loss = self._loss(x, y, pred)
            loss.backward()
            return [v.value.grad for v in self.trainable_variables], loss, pred

        def _apply(self, grads, variables):
            if keras.backend.backend() == "torch":
                import torch

                with torch.no_grad():
                    self.optimizer.apply(grads, variables)
            else:
                self.optimizer.apply(grads, variables)

    return Custom


def main(case: str) -> None:
    import keras_mgpu_plugins as kmp

    factory = build if case == "undecorated" else kmp.parallelize(
        sync_batchnorm=case == "sync_batchnorm",
        random_layers="one_device" if case == "dropout_one_device" else "per_replica")(build)
    model = factory(case)
    batch = BATCH
    if case == "batch_grows":  # a batch size scaled with the devices (a common mistake)
        batch = BATCH * kmp.runtime.of(model).replicas_in_sync
    x, y = data(case)
    # weighted_loss: the second half of each batch weighs 4 times the first
    weights = 1.0 + 3.0 * (np.arange(ROWS) % BATCH >= BATCH // 2) if case == "weighted_loss" \
        else None
    if case != "no_fit":
        model.fit(x, y, sample_weight=weights, batch_size=batch, epochs=2, shuffle=False,
                  verbose=0, validation_data=(x[:32], y[:32]))
    model.evaluate(x, y, batch_size=BATCH, verbose=0)
    model.predict(x[:40], batch_size=BATCH, verbose=0)


def several(names: list[str]) -> None:
    """Each case in turn (a fit each): what one `kmp.verify(several, fits=len(names))` checks."""
    for case in names:
        main(case)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main(sys.argv[1])
