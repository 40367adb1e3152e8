"""A custom `train_step` written the JAX way, after keras.io's guide "Customizing what
happens in `fit()` with JAX" (https://keras.io/guides/custom_train_step_in_jax/).

The guide's lower-level `CustomModel`: `compute_loss_and_updates` through
`stateless_call`, a `train_step(self, state, data)` that takes gradients with
`jax.value_and_grad`, applies them with `optimizer.stateless_apply` and updates its own
`loss_tracker` and `mae_metric` statelessly, and its `test_step`; compiled with the
optimizer only. Here on 101 random rows of 16 features (a last batch of 5).
"""

from __future__ import annotations

import jax
import keras
import numpy as np

ROWS, FEATURES, BATCH_SIZE, EPOCHS = 101, 16, 32, 2


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def compute_loss_and_updates(self, trainable_variables, non_trainable_variables, x, y,
                                 training=False):
        y_pred, non_trainable_variables = self.stateless_call(
            trainable_variables, non_trainable_variables, x, training=training)
        loss = self.loss_fn(y, y_pred)
        return loss, (y_pred, non_trainable_variables)

    def train_step(self, state, data):
        trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables = (
            state)
        x, y = data
        grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
        (loss, (y_pred, non_trainable_variables)), grads = grad_fn(
            trainable_variables, non_trainable_variables, x, y, training=True)
        trainable_variables, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable_variables)
        loss_tracker_vars = metrics_variables[: len(self.loss_tracker.variables)]
        mae_metric_vars = metrics_variables[len(self.loss_tracker.variables):]
        loss_tracker_vars = self.loss_tracker.stateless_update_state(loss_tracker_vars, loss)
        mae_metric_vars = self.mae_metric.stateless_update_state(mae_metric_vars, y, y_pred)
        logs = {self.loss_tracker.name: self.loss_tracker.stateless_result(loss_tracker_vars),
                self.mae_metric.name: self.mae_metric.stateless_result(mae_metric_vars)}
        new_metrics_vars = loss_tracker_vars + mae_metric_vars
        state = (trainable_variables, non_trainable_variables, optimizer_variables,
                 new_metrics_vars)
        return logs, state

    def test_step(self, state, data):
        x, y = data
        trainable_variables, non_trainable_variables, metrics_variables = state
        y_pred, non_trainable_variables = self.stateless_call(
            trainable_variables, non_trainable_variables, x, training=False)
        loss = self.loss_fn(y, y_pred)
        loss_tracker_vars = metrics_variables[: len(self.loss_tracker.variables)]
        mae_metric_vars = metrics_variables[len(self.loss_tracker.variables):]
        loss_tracker_vars = self.loss_tracker.stateless_update_state(loss_tracker_vars, loss)
        mae_metric_vars = self.mae_metric.stateless_update_state(mae_metric_vars, y, y_pred)
        logs = {self.loss_tracker.name: self.loss_tracker.stateless_result(loss_tracker_vars),
                self.mae_metric.name: self.mae_metric.stateless_result(mae_metric_vars)}
        return logs, (trainable_variables, non_trainable_variables,
                      loss_tracker_vars + mae_metric_vars)

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


def data() -> dict:
    rng = np.random.default_rng(21)
    x = rng.random((ROWS, FEATURES)).astype("float32")
    y = rng.random((ROWS, 1)).astype("float32")
    return {"fit": (x, y), "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS},
            "evaluate": {"x": x[:45], "y": y[:45], "batch_size": BATCH_SIZE},
            "predict": {"x": x[:51], "batch_size": BATCH_SIZE}}


def build(optimizer: str = "program") -> keras.Model:
    keras.utils.set_random_seed(2)
    inputs = keras.Input(shape=(FEATURES,))
    outputs = keras.layers.Dense(1)(inputs)
    model = CustomModel(inputs, outputs)
    model.compile(optimizer="adam" if optimizer == "program" else keras.optimizers.SGD(0.1))
    return model
