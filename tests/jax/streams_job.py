"""Functions `kmp.launch` runs in each JAX worker of `tests/jax/test_streams.py`: a
`keras.utils.PyDataset` and a generator, the same on every process, against one device."""

from __future__ import annotations

import time

import numpy as np

ROWS, BATCH, EPOCHS = 32, 8, 2


def data(rows: int = ROWS) -> tuple:
    x = np.random.default_rng(0).normal(size=(rows, 3)).astype("float32")
    y = (x @ np.array([[0.5], [-1.0], [2.0]], "float32") + 0.1).astype("float32")
    return x, y


def model(optimizer: str):
    import keras

    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    built.compile(keras.optimizers.SGD(0.05) if optimizer == "sgd" else
                  keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return built


def batches(arrays: tuple, batch: int = BATCH, repeat: int = 1, rows=None):
    """The global batches of `arrays`, `repeat` times over."""
    total = len(arrays[0]) if rows is None else rows
    for _ in range(repeat):
        for start in range(0, total, batch):
            yield tuple(a[start:start + batch] for a in arrays)


def py_dataset(arrays: tuple, batch: int = BATCH, **options):
    import keras

    class Batches(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__(**options)

        def __len__(self) -> int:
            return -(-len(arrays[0]) // batch)

        def __getitem__(self, i: int) -> tuple:
            part = tuple(a[i * batch:(i + 1) * batch] for a in arrays)
            return part if len(part) > 1 else part[0]

    return Batches()


def source(kind: str, arrays: tuple, repeat: int = 1, **options):
    if kind == "generator":
        return batches(arrays, repeat=repeat)
    if kind == "tf.data":  # Keras reads a finite dataset once per epoch
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(
            arrays if len(arrays) > 1 else arrays[0]).batch(BATCH)
    return py_dataset(arrays, **options)


def run(built, kind: str, x, y, **options) -> dict:
    steps = ({"steps_per_epoch": -(-len(x) // BATCH), "validation_steps": 2}
             if kind == "generator" else {})
    history = built.fit(source(kind, (x, y), EPOCHS, **options), epochs=EPOCHS, verbose=0,
                        shuffle=False, validation_data=source(kind, (x[:16], y[:16]), EPOCHS),
                        **steps)
    evaluated = built.evaluate(source(kind, (x, y), **options), verbose=0)
    predicted = built.predict(source(kind, (x,), **options), verbose=0)
    return {"history": history.history, "evaluate": evaluated, "predict": predicted.tolist(),
            "weights": [w.tolist() for w in built.get_weights()]}


def parity(kind: str, optimizer: str, workers: int = 1, rows: int = ROWS) -> dict:
    """fit (with validation_data), evaluate, predict on 2 processes; then one device, here.
    With `rows` not a multiple of the batch: a last batch that does not divide (29 rows: 5)."""
    import keras

    import keras_mgpu_plugins as kmp

    x, y = data(rows)
    options = {"workers": workers} if kind == "PyDataset" and workers > 1 else {}
    found = run(kmp.parallelize(model)(optimizer), kind, x, y, **options)
    keras.distribution.set_distribution(None)
    return {"processes": found, "reference": run(model(optimizer), kind, x, y)}


def differing(kind: str) -> dict:
    """Process 1's input differs (its rows at batch 2, or one batch less): the errors."""
    import jax

    import keras_mgpu_plugins as kmp

    x, y = data()
    built = kmp.parallelize(model)("sgd")
    other = jax.process_index() == 1
    errors = {}
    changed = x.copy()
    if other:  # from batch 2 on, another order (as an unseeded shuffle would give)
        changed[2 * BATCH:] = changed[2 * BATCH:][::-1]
    calls = {
        "rows": lambda: built.fit(source(kind, (changed, y)), epochs=1, verbose=0,
                                  shuffle=False, steps_per_epoch=4 if kind == "generator" else None),
        "length": lambda: built.evaluate(
            batches((x, y), rows=ROWS - BATCH * other) if kind == "generator"
            else py_dataset((x[:ROWS - BATCH * other], y[:ROWS - BATCH * other])), verbose=0),
    }
    for name, call in calls.items():
        try:
            call()
            errors[name] = "no error"
        except ValueError as err:
            errors[name] = f"{type(err).__name__}: {err}"
    return errors


def refusals() -> dict:
    """The clear errors: use_multiprocessing, other iterators."""
    import keras_mgpu_plugins as kmp

    x, y = data()
    built = kmp.parallelize(model)("sgd")
    calls = {
        "multiprocessing": lambda: built.fit(py_dataset((x, y), use_multiprocessing=True,
                                                        workers=2), verbose=0),
        "iterator": lambda: built.predict(iter([x[:8]]), verbose=0),
    }
    errors = {}
    for name, call in calls.items():
        try:
            call()
            errors[name] = "no error"
        except ValueError as err:
            errors[name] = str(err)
    return errors


def shuffled_py_dataset(optimizer: str) -> dict:
    """fit(shuffle=True) on a PyDataset, 2 processes: the batch order kmp asked for (a new
    permutation each pass, shared); then Keras's own fit(shuffle=True) of it on one device,
    seeded alike (Keras shuffles a PyDataset's batches with Python's `random`)."""
    import keras

    import keras_mgpu_plugins as kmp

    x, y = data()
    dataset, asked = py_dataset((x, y)), []
    serve = dataset.__getitem__
    type(dataset).__getitem__ = lambda self, i: asked.append(int(i)) or serve(i)
    history = kmp.parallelize(model)(optimizer).fit(dataset, epochs=EPOCHS, verbose=0)
    type(dataset).__getitem__ = serve
    keras.distribution.set_distribution(None)
    reference = model(optimizer)
    alone = reference.fit(py_dataset((x, y)), epochs=EPOCHS, verbose=0)
    return {"asked": asked, "history": history.history,
            "weights": [w.tolist() for w in history.model.get_weights()],
            "reference": [w.tolist() for w in reference.get_weights()],
            "reference_history": alone.history}


CASES = (("PyDataset", "sgd", 1, ROWS), ("PyDataset", "adam", 1, ROWS),
         ("generator", "sgd", 1, ROWS), ("generator", "adam", 1, ROWS),
         ("PyDataset", "sgd", 2, ROWS), ("PyDataset", "adam", 1, 29), ("generator", "sgd", 1, 29))


def every_parity() -> dict:
    """`parity` of every case of `CASES`, in one job."""
    found = {"/".join(map(str, case)): parity(*case) for case in CASES}
    found.update({f"shuffled/{o}": shuffled_py_dataset(o) for o in ("sgd", "adam")})
    return found


def tf_data_parity() -> dict:
    """`parity` of a `tf.data.Dataset` (SGD, Adam), where TensorFlow is installed."""
    return {optimizer: parity("tf.data", optimizer) for optimizer in ("sgd", "adam")}


def every_error() -> dict:
    """`differing` for both kinds, `refusals`, in one job."""
    return {"generator": differing("generator"), "PyDataset": differing("PyDataset"),
            "refusals": refusals()}


def check_cost(steps: int = 400) -> dict:
    """Seconds of fit over `steps` batches of a PyDataset: each batch compared ("every"),
    kmp's grouping ("grouped"), no comparison ("none")."""
    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.inputs import streams

    x, y = data(steps * BATCH)
    built = kmp.parallelize(model)("sgd")
    built.fit(py_dataset((x[:64], y[:64])), verbose=0, shuffle=False)  # compiled
    seconds = {}
    real, first = streams.compare, streams.CHECK_FIRST
    for name in ("every", "grouped", "none") * 3:
        streams.CHECK_FIRST = 10**9 if name == "every" else first
        streams.compare = real if name != "none" else (lambda *a, **k: None)
        start = time.perf_counter()
        built.fit(py_dataset((x, y)), verbose=0, shuffle=False)
        seconds.setdefault(name, []).append(round(time.perf_counter() - start, 3))
    streams.compare, streams.CHECK_FIRST = real, first
    return seconds
