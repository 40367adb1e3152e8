"""keras.io's distribution guide ("Distributed training with Keras 3",
https://keras.io/guides/distribution/), both of its models.

Its `DataParallel` model (Flatten, `Dense(200, "relu")`, `Dropout(0.4)`, a softmax
`Dense(10)`, compiled with `loss="mse"`, `optimizer="adam"`), trained as the guide's
comments say: built normally, then `fit` as on one device. And its `ModelParallel` model
(`Dense(200, "relu", name="d1")`, `Dense(10, "softmax", name="d2")`) with the guide's own
`LayoutMap` on its own `("data", "model")` mesh: `d1/kernel` and `d1/bias` sharded over
"model", and the *output* of `d2` laid out over "data" (`"d2/output"`). Here on 8x8
"images", 40 units instead of 200; `predict` on 29 rows.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

ROWS, BATCH_SIZE, EPOCHS = 83, 16, 2
LARGE = True  # the guide's ModelParallel part: also trained with strategy="model_parallel"


def data() -> dict:
    rng = np.random.default_rng(19)
    x = rng.random((ROWS, 8, 8, 1)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 10, ROWS), 10)
    x_test = rng.random((29, 8, 8, 1)).astype("float32")
    y_test = keras.utils.to_categorical(rng.integers(0, 10, 29), 10)
    return {"fit": (x, y), "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS},
            "evaluate": {"x": x_test, "y": y_test, "batch_size": BATCH_SIZE},
            "predict": {"x": x_test, "batch_size": BATCH_SIZE}}


def build(optimizer: str = "program") -> keras.Model:
    keras.utils.set_random_seed(12)
    inputs = layers.Input(shape=(8, 8, 1))
    y = layers.Flatten()(inputs)
    y = layers.Dense(units=40, activation="relu", name="d1")(y)
    y = layers.Dropout(0.4, seed=1)(y)
    outputs = layers.Dense(units=10, activation="softmax", name="d2")(y)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(loss="mse", optimizer="adam" if optimizer == "program"
                  else keras.optimizers.SGD(0.1))
    return model


def layout_map():
    """The guide's own LayoutMap, on its own mesh (axes "data" and "model")."""
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh(shape=(1, len(devices)), axis_names=["data", "model"],
                                         devices=devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["d1/kernel"] = (None, "model")
    layout_map["d1/bias"] = ("model",)
    layout_map["d2/output"] = ("data", None)
    return layout_map
