"""One process of the JAX tests: `python -m tests.jax.program CASE OUT [PROCESS_ID]`.

Cases: "reference" (plain Keras, one device), "devices" (kmp.simulate_devices(2),
@kmp.parallelize), "processes" (one of 2 processes: KERAS_DISTRIBUTION_* or TF_CONFIG in
the environment, @kmp.parallelize), "late" (simulate_devices after JAX started). Writes what it measured to OUT (an .npz).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np

ROWS, FEATURES, BATCH, EPOCHS = 24, 4, 8, 2


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1).astype("float32")
    return x, y


def build(batchnorm: bool = False, adam: bool = False):
    import keras

    keras.utils.set_random_seed(7)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(6, activation="tanh")]
    if batchnorm:
        layers.append(keras.layers.BatchNormalization())
    model = keras.Sequential([*layers, keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.01) if adam else keras.optimizers.SGD(0.05)
    # The plain model sums its loss over the batch: P copies of a batch would train otherwise.
    loss = "mse" if adam or batchnorm else keras.losses.MeanSquaredError(reduction="sum")
    model.compile(optimizer=optimizer if adam or batchnorm else keras.optimizers.SGD(0.005),
                  loss=loss, metrics=["mae"])
    return model


def train(model, x, y):
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(x[:16], y[:16]))
    evaluated = model.evaluate(x, y, batch_size=BATCH, verbose=0)
    predicted = model.predict(x, batch_size=BATCH, verbose=0)
    return {"history": json.dumps(history.history), "evaluate": np.asarray(evaluated),
            "predict": predicted, **{f"w{i}": w for i, w in enumerate(model.get_weights())}}


def partial(model, x, y, batch_size=BATCH):
    """Row counts that do not divide over 2 devices: 21 rows to fit (a last batch of 5 with
    batch_size=8), 13 to validate, 21 to evaluate, 23 to predict; or batch_size=5 (no batch
    divides)."""
    history = model.fit(x[:21], y[:21], batch_size=batch_size, epochs=EPOCHS, shuffle=False,
                        verbose=0, validation_data=(x[:13], y[:13]))
    evaluated = model.evaluate(x[:21], y[:21], batch_size=batch_size, verbose=0)
    predicted = model.predict(x[:23], batch_size=batch_size, verbose=0)
    return {"history": json.dumps(history.history), "evaluate": np.asarray(evaluated),
            "predict": predicted, **{f"w{i}": w for i, w in enumerate(model.get_weights())}}


def errors(model, x, y):
    """The clear errors bad inputs raise (each message, by case)."""
    found = {}
    cases = {
        "shuffle": lambda: model.fit(x, y, batch_size=8, verbose=0),
        "iterator": lambda: model.fit(iter([(x[:8], y[:8])] * 2), steps_per_epoch=2,
                                      shuffle=False, verbose=0),
    }
    for name, call in cases.items():
        try:
            call()
            found[f"error_{name}"] = "no error"
        except ValueError as err:
            found[f"error_{name}"] = str(err)
    return found


def collectives():
    from keras_mgpu_plugins import runtime

    run = runtime.of()
    rank = run.rank()
    return {
        "rank": np.array([rank.worker_index, rank.num_workers, int(rank.is_chief)]),
        "spans": np.array(run.spans_workers),
        "gathered_f": run.all_gather(np.array([rank.worker_index + 0.5, 1e300, -2.25])),
        "gathered_i": run.all_gather(np.array([2**62 + rank.worker_index, -7], np.int64)),
        "agree_any": np.array(run.agree(rank.worker_index == 1, "any")),
        "agree_all": np.array(run.agree(rank.worker_index == 1, "all")),
        "broadcast": run.broadcast(np.array([10.0 + rank.worker_index])),
        "replicas": np.array(run.replicas_in_sync),
        "describe": json.dumps(run.describe()),
    }


def main(case: str, out: str) -> None:
    os.environ["KERAS_BACKEND"] = "jax"
    import keras_mgpu_plugins as kmp

    if case == "devices":
        from keras_mgpu_plugins.backends.jax.devices import simulate_devices

        simulate_devices(2)
    x, y = data()
    results = {}
    if case == "reference":
        model = build()
        results.update(train(model, x, y))
        results.update({f"bn_{k}": v for k, v in train(build(True), x, y).items()})
        results.update({f"adam_{k}": v for k, v in train(build(adam=True), x, y).items()})
        results.update({f"partial_{k}": v for k, v in partial(build(True), x, y).items()})
        results.update({f"odd_{k}": v for k, v in partial(build(adam=True), x, y, 5).items()})
    elif case == "late":
        import jax

        from keras_mgpu_plugins.backends.jax.devices import simulate_devices

        jax.devices()
        results["same"] = np.array(simulate_devices(1))
        try:
            simulate_devices(3)
        except RuntimeError as err:
            results["error"] = np.array(str(err))
    else:
        factory = kmp.parallelize(build)
        model = factory()
        results.update(collectives())
        results.update(train(model, x, y))
        results.update({f"bn_{k}": v for k, v in train(factory(True), x, y).items()})
        results.update({f"adam_{k}": v for k, v in train(factory(adam=True), x, y).items()})
        results.update({f"partial_{k}": v for k, v in partial(factory(True), x, y).items()})
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            odd = partial(factory(adam=True), x, y, 5)
        results.update({f"odd_{k}": v for k, v in odd.items()})
        results["odd_warnings"] = np.array([str(w.message) for w in seen if "batch_size=5" in
                                            str(w.message)] or [""])
        results.update(errors(model, x, y))
    np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
