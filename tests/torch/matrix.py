"""The fit-settings matrix on torch (`cases.suite` runs these by name): each scenario builds
its model with `@kmp.parallelize` (one process: the one-device reference) and returns its
weights, History, predict, or the error it raised."""

from __future__ import annotations

import json

import numpy as np

from tests.torch.cases import FEATURES, data, measured

ROWS, BATCH = 22, 4


def _build(optimizer=None, policy=None, compile_args=None, model_class=None, batchnorm=False):
    import keras

    import keras_mgpu_plugins as kmp

    @kmp.parallelize
    def build():
        keras.utils.set_random_seed(11)
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(6, activation="tanh")(inputs)
        if batchnorm:
            hidden = keras.layers.BatchNormalization()(hidden)
        outputs = keras.layers.Dense(1, dtype="float32")(hidden)
        cls = model_class or keras.Model
        model = cls(inputs, outputs)
        model.compile(optimizer=optimizer() if optimizer else keras.optimizers.SGD(0.05),
                      loss="mse", metrics=["mae"], **(compile_args or {}))
        return model

    if policy is None:
        return build()
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        return build()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def _fit(model, epochs=2, **kwargs):
    x, y = data(ROWS)
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                        **kwargs)
    return measured(model, history, predict=model.predict(x, batch_size=BATCH, verbose=0))


def mixed_precision(policy: str = "mixed_float16") -> dict:
    """`mixed_float16` (Keras wraps the optimizer in a LossScaleOptimizer) or
    `mixed_bfloat16`."""
    import keras

    model = _build(lambda: keras.optimizers.Adam(0.01), policy=policy)
    found = _fit(model)
    found["optimizer"] = type(model.optimizer).__name__
    return found


def accumulation(steps: int = 2) -> dict:
    import keras

    return _fit(_build(lambda: keras.optimizers.SGD(0.05, gradient_accumulation_steps=steps)))


def ema() -> dict:
    import keras

    return _fit(_build(lambda: keras.optimizers.Adam(0.01, use_ema=True, ema_momentum=0.9)))


def steps_per_execution(steps: int = 2) -> dict:
    """Keras 3.15 refuses it on torch on one device too; keras-nightly runs it."""
    try:
        return _fit(_build(compile_args={"steps_per_execution": steps}))
    except ValueError as err:
        return {"error_text": str(err).split("\n")[0]}


def jit_compile() -> dict:
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return {"error_text": "not run on one device (torch.compile takes a minute there)"}
    try:
        return _fit(_build(compile_args={"jit_compile": True}))
    except Exception as err:  # noqa: BLE001 - the refusal, or torch.compile's own error
        return {"error_text": f"{type(err).__name__}: {str(err).splitlines()[0]}"}


def _metrics_by_hand(model, loss, y, y_pred) -> dict:
    """The recipe's metric updates: the loss tracker from `loss`, the others from `y`."""
    for metric in model.metrics:
        if metric.name == "loss":
            metric.update_state(loss)
        else:
            metric.update_state(y, y_pred)
    return {m.name: m.result() for m in model.metrics}


def torch_train_step() -> dict:
    """keras.io's "custom train_step in PyTorch" recipe: zero_grad, backward, the optimizer's
    apply, the metrics updated by hand, `{m.name: m.result()}` returned."""
    import keras
    import torch

    class CustomModel(keras.Model):
        def train_step(self, data):
            x, y = data
            self.zero_grad()
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            loss.backward()
            trainable_weights = [v for v in self.trainable_weights]
            gradients = [v.value.grad for v in trainable_weights]
            with torch.no_grad():
                self.optimizer.apply(gradients, trainable_weights)
            return _metrics_by_hand(self, loss, y, y_pred)

    return _fit(_build(lambda: keras.optimizers.Adam(0.01), model_class=CustomModel))


def two_backward_passes(touched: bool = False) -> dict:
    """A custom train_step with two backward passes into the same gradients (a second loss
    accumulated) and no `scale_loss` (kmp weights the gradients in `apply`); `touched`: the
    gradients then scaled in place before `apply`."""
    import keras
    import torch

    class TwoLosses(keras.Model):
        def train_step(self, data):
            x, y = data
            self.zero_grad()
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            (loss * 0.5).backward()
            (0.5 * self.compute_loss(y=y, y_pred=self(x, training=True))).backward()
            weights = list(self.trainable_weights)
            if touched:
                with torch.no_grad():
                    for v in weights:
                        v.value.grad.mul_(2.0)
            with torch.no_grad():
                self.optimizer.apply([v.value.grad for v in weights], weights)
            return _metrics_by_hand(self, loss, y, y_pred)

    return _fit(_build(lambda: keras.optimizers.Adam(0.01), model_class=TwoLosses))


def fit_twice() -> dict:
    """fit, then fit again from initial_epoch=2 (History of the second)."""
    model = _build()
    first = _fit(model)
    x, y = data(ROWS)
    second = model.fit(x, y, batch_size=BATCH, epochs=4, initial_epoch=2, shuffle=False,
                       verbose=0)
    return {**measured(model, second), "first_history": first["history"],
            "predict": first["predict"]}


def recompiled() -> dict:
    """Compiled again outside the factory (fine-tuning with a new optimizer) before fit."""
    import keras

    model = _build()
    _fit(model, epochs=1)
    model.compile(keras.optimizers.Adam(0.005), "mse", metrics=["mae"])
    return _fit(model)


def loss_sum_refused() -> dict:
    import keras

    import keras_mgpu_plugins as kmp

    @kmp.parallelize
    def build():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        model.compile("sgd", keras.losses.MeanSquaredError(reduction="sum"))
        return model

    x, y = data(8)
    try:
        build().fit(x, y, batch_size=4, verbose=0)
        return {"error_text": "no error"}
    except ValueError as err:
        return {"error_text": str(err)}


def history_of(result: dict) -> dict:
    return json.loads(result["history"])


def weights_of(result: dict) -> list[np.ndarray]:
    return [result[k] for k in sorted(result) if k[0] == "w" and k[1:].isdigit()]
