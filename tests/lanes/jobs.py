"""Functions `kmp.launch` runs in each worker of the lane tests (any backend)."""

from __future__ import annotations

import os

import numpy as np

ROWS, BATCH = 16, 8


def data() -> tuple:
    x = np.random.default_rng(0).normal(size=(ROWS, 3)).astype("float32")
    return x, (x @ np.array([[0.5], [-1.0], [2.0]], "float32")).astype("float32")


def build():
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def _fit(model, callbacks: list) -> str:
    """`"trained"`, or the error `fit` raised, as `"Type: message"`; and whether a step ran."""
    x, y = data()
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=callbacks)
        return "trained"
    except Exception as err:  # noqa: BLE001 - the test reads which error, and its text
        steps = int(model.optimizer.iterations.numpy())
        return f"{type(err).__name__}: {err} [steps {steps}]"


def separate_models(folder: str) -> dict:
    """Undecorated fits on every process, with kmp's callbacks, with Keras's own, with none;
    then the decorated model with both; then the chief alone trains a model it loaded."""
    import keras

    import keras_mgpu_plugins as kmp

    rank = kmp.topology().worker_index
    found = {"kmp_callbacks": _fit(build(), [kmp.callbacks.EarlyStopping("loss", patience=1)]),
             "keras_callbacks": _fit(build(), [keras.callbacks.CSVLogger(
                 os.path.join(folder, "plain.csv"))]),
             "no_callbacks": _fit(build(), [])}
    if keras.backend.backend() == "tensorflow":  # the job's own strategy, as patch_keras users
        from keras_mgpu_plugins.strategy import get_strategy

        with get_strategy("multi_worker").scope():
            found["job_strategy"] = _fit(build(), [kmp.callbacks.EarlyStopping("loss")])
    model = kmp.parallelize(build)()
    found["decorated"] = _fit(model, [kmp.callbacks.EarlyStopping("loss", patience=1),
                                      keras.callbacks.CSVLogger(os.path.join(folder, "kmp.csv"))])
    found["keras_checkpoint"] = _fit(kmp.parallelize(build)(), [
        keras.callbacks.ModelCheckpoint(os.path.join(folder, "k.keras"))])
    found["tensorboard"] = _fit(kmp.parallelize(build)(), [
        keras.callbacks.TensorBoard(os.path.join(folder, "tb"))])
    if rank == 0:  # one process may do what one device does
        path = os.path.join(folder, "model.keras")
        model.save(path)
        loaded, reference = keras.models.load_model(path), build()
        reference.set_weights(model.get_weights())
        found["chief_alone"] = _fit(loaded, [])
        _fit(reference, [])
        found["chief_alone_diff"] = max(float(np.abs(a - b).max()) for a, b in
                                        zip(loaded.get_weights(), reference.get_weights(),
                                            strict=True))
    return found


def kmp_callbacks_only(folder: str) -> dict:
    """Before kmp joined the job (no strategy, process group or jax.distributed): an
    undecorated fit given kmp's callbacks, then one given Keras's only."""
    import keras

    import keras_mgpu_plugins as kmp

    return {"kmp_callbacks": _fit(build(), [kmp.callbacks.ModelCheckpoint(
                os.path.join(folder, "m.keras"))]),
            "keras_callbacks": _fit(build(), [keras.callbacks.CSVLogger(
                os.path.join(folder, f"own-{kmp.topology().worker_index}.csv"))])}
