"""What one process of a verify run records: the callbacks kmp adds to the first `fit`,
the first `evaluate`, and the record each process writes.

`Recorder` (in the first `fit`) keeps, after each of the first `steps` training steps,
the logs Keras gives the batch hook and a sample of every model variable; at each epoch's
end its logs (validation included); at the end every model and optimizer variable whole,
then stops the fit (later steps are not compared). Its batch hook makes Keras call the
callbacks synchronously: a verify run is not timed. `TestRecorder` keeps the logs the
first `evaluate` ends with. Each process writes its record to `<folder>/<run>-<worker>.pkl`
(`write`) after each of those; every process records (a JAX variable that spans
processes is read by all of them together), so each has its own file.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np

from keras_mgpu_plugins import _backend
from keras_mgpu_plugins.io import atomic
from keras_mgpu_plugins.verify import _config, _facts

#: Elements of a variable kept at each step (a strided sample of larger ones).
SAMPLE = 4096
#: Elements of `predict`'s outputs kept whole (a strided sample of more).
PREDICT_WHOLE = 1 << 20


def sample(array: Any, size: int = SAMPLE) -> np.ndarray:
    """`array` flattened, or `size` of its elements at a fixed stride."""
    flat = np.asarray(array).ravel()
    if flat.size <= size:
        return flat.copy()
    return flat[np.linspace(0, flat.size - 1, size).astype(np.int64)].copy()


def _floats(logs: Any) -> dict[str, float]:
    found = {}
    for key, value in (logs or {}).items():
        try:
            found[str(key)] = float(np.asarray(value))
        except (TypeError, ValueError):
            continue
    return found


def variables_of(model: Any, with_optimizer: bool = False) -> dict[str, np.ndarray]:
    """Every variable of `model` (and its optimizer's) by its path, read to the host."""
    found: dict[str, np.ndarray] = {}
    pairs = [("", v) for v in model.weights]
    optimizer = getattr(model, "optimizer", None)
    if with_optimizer and optimizer is not None:
        pairs += [("optimizer/", v) for v in getattr(optimizer, "variables", [])]
    host = _backend.active().host_value
    for prefix, variable in pairs:
        name = prefix + str(getattr(variable, "path", None) or variable.name)
        key, n = name, 1
        while key in found:
            n += 1
            key = f"{name}#{n}"
        found[key] = np.array(host(variable), copy=True)
    return found


def new_fit() -> dict[str, Any]:
    """What is recorded of one compared `fit` (and the `evaluate` / `predict` after it)."""
    return {"steps": [], "epochs": [], "evaluate": None, "predict": None, "initial": None,
            "final": None, "facts": None, "data": None, "settings": None, "notes": [],
            "fingerprint": None}


class Record:
    """What this process recorded, written after each part: `data["fits"]` holds one
    `new_fit()` per compared fit, in order."""

    def __init__(self, config: _config.Config) -> None:
        self.config = config
        self.data: dict[str, Any] = {"run": config.run, "fits": [], "fit_calls": 0,
                                     "undecorated": []}

    def write(self, model: Any = None) -> None:
        from keras_mgpu_plugins import _random_layers
        from keras_mgpu_plugins.verify import _fingerprint, _sources

        for fit in self.data["fits"]:
            if fit["fingerprint"] is not None:
                fit["data"] = _fingerprint.final(fit["fingerprint"])
        self.data["unseedable"] = list(_sources.UNSEEDABLE)
        self.data["clock"] = list(_sources.CLOCK)
        self.data["uncovered"] = list(_random_layers.UNCOVERED)
        worker = 0
        if model is not None:
            from keras_mgpu_plugins import runtime

            rank = runtime.of(model).rank()
            worker = rank.worker_index
            self.data["workers"] = rank.num_workers
        self.data.setdefault("workers", 1)
        path = os.path.join(self.config.folder, f"{self.config.run}-{worker}.pkl")
        fits = [{k: v for k, v in f.items() if k != "fingerprint"} for f in self.data["fits"]]
        atomic.write_bytes_atomic(path, pickle.dumps({**self.data, "fits": fits}))


def _keras_callback() -> type:
    import keras

    return keras.callbacks.Callback


class Recorder(_keras_callback()):  # type: ignore[misc]
    """Records the first `steps` training steps of a fit, then stops it."""

    def __init__(self, record: Record, fit: dict, steps: int) -> None:
        super().__init__()
        self.record, self.fit, self.steps = record, fit, steps
        self.step = self.offset = 0
        self.done = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.fit["facts"] = _facts.of(self.model)
        self.fit["initial"] = {k: sample(v) for k, v in variables_of(self.model).items()}

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.done:
            return
        self.step = self.offset + batch + 1
        variables = {k: sample(v) for k, v in variables_of(self.model).items()}
        self.fit["steps"].append({"step": self.step, "logs": _floats(logs),
                                  "variables": variables})
        if self.step >= self.steps:
            self.done = True
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.offset = self.step
        if self.step <= self.steps and not any(e["epoch"] == epoch for e in self.fit["epochs"]):
            self.fit["epochs"].append({"epoch": epoch, "step": self.step, "logs": _floats(logs)})

    def on_train_end(self, logs: dict | None = None) -> None:
        self.fit["final"] = variables_of(self.model, with_optimizer=True)
        self.record.write(self.model)


class TestRecorder(_keras_callback()):  # type: ignore[misc]
    """Keeps the logs the first `evaluate` ends with."""

    def __init__(self, fit: dict) -> None:
        super().__init__()
        self.fit = fit

    def on_test_end(self, logs: dict | None = None) -> None:
        self.fit["evaluate"] = _floats(logs)


def predictions(outputs: Any) -> list[np.ndarray]:
    """`predict`'s outputs, flattened into arrays (whole, or sampled when large)."""
    import keras

    leaves = [np.asarray(keras.ops.convert_to_numpy(o)) for o in keras.tree.flatten(outputs)]
    total = sum(leaf.size for leaf in leaves)
    if total <= PREDICT_WHOLE:
        return [np.array(leaf, copy=True) for leaf in leaves]
    return [sample(leaf, max(1, PREDICT_WHOLE * leaf.size // total)) for leaf in leaves]
