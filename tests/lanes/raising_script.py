"""A training script whose worker `BOOM_RANK` raises in the middle of `fit` (the lane tests
of the launcher's exits: `kmp-launch -n 2 raising_script.py`)."""

import os

import keras
import numpy as np

import keras_mgpu_plugins as kmp


@kmp.parallelize
def build():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


class Boom(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2 and kmp.topology().worker_index == int(os.environ["BOOM_RANK"]):
            raise ValueError(f"worker {kmp.topology().worker_index} broke on purpose")


x, y = np.ones((64, 3), "float32"), np.ones((64, 1), "float32")
build().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Boom()])
