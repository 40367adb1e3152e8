"""A small convnet on digits, after https://keras.io/examples/vision/mnist_convnet/.

The example's Sequential model (two Conv2D + MaxPooling2D blocks, Flatten, Dropout,
a softmax Dense), its compile arguments (`"adam"`, categorical cross-entropy,
accuracy) and its `fit` (one-hot labels, `validation_split=0.1`), here on 12x12
random "digits" with fewer filters and the dropout rate at 0.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

NUM_CLASSES = 10
INPUT_SHAPE = (12, 12, 1)
ROWS, BATCH_SIZE, EPOCHS = 320, 32, 2  # validation_split=0.1: 288 rows, 9 full batches


def data() -> dict:
    rng = np.random.default_rng(11)
    x = rng.uniform(size=(ROWS, *INPUT_SHAPE)).astype("float32")
    labels = rng.integers(0, NUM_CLASSES, size=ROWS)
    y = keras.utils.to_categorical(labels, NUM_CLASSES)  # as the example does
    x_test = rng.uniform(size=(64, *INPUT_SHAPE)).astype("float32")
    y_test = keras.utils.to_categorical(rng.integers(0, NUM_CLASSES, size=64), NUM_CLASSES)
    return {"fit": (x, y),
            "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS, "validation_split": 0.1},
            "evaluate": {"x": x_test, "y": y_test, "batch_size": BATCH_SIZE}}


def build(optimizer: str = "program") -> keras.Model:
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input(shape=INPUT_SHAPE),
            layers.Conv2D(4, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(8, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.0),  # 0.5 in the example
            layers.Dense(NUM_CLASSES, activation="softmax"),
        ]
    )
    model.compile(loss="categorical_crossentropy",
                  optimizer="adam" if optimizer == "program" else keras.optimizers.SGD(0.05),
                  metrics=["accuracy"])
    return model
