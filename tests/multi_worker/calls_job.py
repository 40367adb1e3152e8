"""Functions `kmp.launch` runs in each TensorFlow worker of `tests/multi_worker/test_calls.py`:
what one worker may do alone (save, load, predict with and train a loaded model) and what it
may not (the distributed model's evaluate on one worker: an error on every worker waiting,
within seconds, never a hang)."""

from __future__ import annotations

import os
import time

import numpy as np

ROWS, BATCH = 24, 8


def _data():
    x = np.random.default_rng(0).normal(size=(ROWS, 3)).astype("float32")
    return x, (x @ np.array([[0.5], [-1.0], [2.0]], "float32")).astype("float32")


def _model():
    import keras

    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(3)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4)),
    ])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def chief_alone(folder: str) -> dict:
    """Every worker trains and predicts; then the chief alone prints a summary, exports, saves,
    loads, predicts with, trains and evaluates the loaded model (one device), as the docs'
    chief-only pattern does."""
    import contextlib
    import io

    import keras
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    x, y = _data()
    model = kmp.parallelize(_model)()
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    everywhere = model.predict(x, batch_size=BATCH, verbose=0)
    found = {"predict": everywhere.tolist(), "seconds": None}
    if kmp.topology().is_chief:
        start = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()) as summary:
            model.summary()
        found["summary"] = summary.getvalue()
        model.export(os.path.join(folder, "exported"))  # a SavedModel
        exported = tf.saved_model.load(os.path.join(folder, "exported"))  # kept: its variables
        found["exported_predict"] = exported.serve(x).numpy().tolist()
        path = os.path.join(folder, "model.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
        found["loaded_predict"] = loaded.predict(x, batch_size=BATCH, verbose=0).tolist()
        loaded.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        found["loaded_evaluate"] = float(loaded.evaluate(x, y, batch_size=BATCH, verbose=0))
        reference = _model()  # plain Keras, one device, the same start and batches
        reference.set_weights(model.get_weights())
        reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        found["loaded_trained"] = [w.tolist() for w in loaded.get_weights()]
        found["reference_trained"] = [w.tolist() for w in reference.get_weights()]
        found["reference_evaluate"] = float(reference.evaluate(x, y, batch_size=BATCH, verbose=0))
        found["seconds"] = time.monotonic() - start
    return found


def one_calls_alone(case: str) -> dict:
    """The chief calls the distributed model's evaluate alone; the other worker ends
    ("ended") or calls predict ("other")."""
    import keras_mgpu_plugins as kmp

    x, y = _data()
    model = kmp.parallelize(_model)()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              validation_data=(x, y))  # fit's own evaluate is not a call of its own
    start = time.monotonic()
    try:
        if kmp.topology().is_chief:
            model.evaluate(x, y, batch_size=BATCH, verbose=0)
        elif case == "other":
            model.predict(x, batch_size=BATCH, verbose=0)
        error = "no error"
    except Exception as err:  # noqa: BLE001 - the test reads which error, and its text
        error = f"{type(err).__name__}: {err}"
    return {"error": error, "seconds": time.monotonic() - start}
