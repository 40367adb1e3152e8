"""What each process of the JAX model-parallel tests runs (`kmp.launch`, 2 processes of 2
CPU devices each: `strategy="hybrid"`), and the shared model and data.

`build(adam)` is a tiny model with an Embedding, Dense kernels sharded by columns and one
Dense (5 columns) that does not divide over 2 devices; `train(model)` fits, evaluates
and predicts it, as on one device.
"""

from __future__ import annotations

import json
import os

import numpy as np

ROWS, LENGTH, VOCAB, BATCH, EPOCHS = 32, 6, 32, 8, 2


def data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, size=(ROWS, LENGTH)).astype("int32")
    y = rng.normal(size=(ROWS, 2)).astype("float32")
    return x, y


def build(adam: bool = False):
    import keras

    keras.utils.set_random_seed(7)
    inputs = keras.Input((LENGTH,), dtype="int32")
    hidden = keras.layers.Flatten()(keras.layers.Embedding(VOCAB, 16, name="table")(inputs))
    hidden = keras.layers.Dense(32, activation="tanh", name="hidden")(hidden)
    hidden = keras.layers.Dense(5, name="narrow")(hidden)  # 5 columns: replicated over 2
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))
    model.compile(keras.optimizers.Adam(0.01) if adam else keras.optimizers.SGD(0.05), "mse",
                  metrics=["mae"])
    return model


def train(model, callbacks=(), batch=BATCH) -> dict:
    x, y = data()
    history = model.fit(x, y, batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(x[:16], y[:16]), callbacks=list(callbacks))
    return {"history": json.dumps(history.history),
            "evaluate": np.asarray(model.evaluate(x, y, batch_size=BATCH, verbose=0)),
            "predict": model.predict(x, batch_size=BATCH, verbose=0)}


def weights(model) -> list:
    from keras_mgpu_plugins.backends.jax.values import host_value

    return [host_value(v) for v in model.weights]


def hybrid_job(folder: str) -> dict:
    """strategy="hybrid" on this process (one of 2, 2 devices each), SGD and Adam: what it
    trained, the shards it holds, its report; Adam's run writes a `.keras` checkpoint."""
    import jax

    import keras_mgpu_plugins as kmp

    found = {"processes": jax.process_count(), "local_devices": len(jax.local_devices())}
    for name, adam in (("sgd", False), ("adam", True)):
        model = kmp.parallelize(build, strategy="hybrid")(adam)
        checkpoint = kmp.callbacks.ModelCheckpoint(os.path.join(folder, f"{name}.keras"))
        results = train(model, [checkpoint])
        results["weights"] = weights(model)
        kernel = next(v for v in model.weights if v.path == "hidden/kernel")
        results["shards"] = [tuple(s.data.shape) for s in kernel.value.addressable_shards]
        results["mesh"] = dict(kernel.value.sharding.mesh.shape)
        results["report"] = str(kmp.placement_report(model))
        try:
            model.get_weights()
            results["get_weights"] = "works"
        except Exception as err:  # noqa: BLE001 - what plain Keras does, recorded
            results["get_weights"] = f"{type(err).__name__}: {err}"
        found[name] = results
    return found
