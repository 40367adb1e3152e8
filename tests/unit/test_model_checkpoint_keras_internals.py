"""The Keras internals ModelCheckpoint relies on are still there and still mean the same.

`kmp.callbacks.ModelCheckpoint` overrides Keras's private `_save_model` and calls
its `_get_file_path` / `_should_save_model`; async and multi-worker saves copy
the checkpoint through `keras.src.saving.saving_lib` internals. Checked against
Keras 3.15.1. If a Keras upgrade changes them, these tests fail first, with the
name of what changed.
"""

from __future__ import annotations

import inspect
import io
import json
import zipfile

import h5py
import keras
import numpy as np
import pytest

from keras_mgpu_plugins.callbacks.model_checkpoint import ModelCheckpoint
from keras_mgpu_plugins.compat import _private_uses as _keras_private
from keras_mgpu_plugins.io import snapshots


def params(fn):
    return list(inspect.signature(fn).parameters)


def test_keras_model_checkpoint_private_methods_we_use_exist_with_their_signatures():
    base = keras.callbacks.ModelCheckpoint
    assert params(base._save_model) == ["self", "epoch", "batch", "logs"]
    assert params(base._get_file_path) == ["self", "epoch", "batch", "logs"]
    assert params(base._should_save_model) == ["self", "epoch", "batch", "logs", "filepath"]


def test_keras_hooks_still_save_through_save_model():
    """Our override is only reached if Keras's hooks call `self._save_model`."""
    base = keras.callbacks.ModelCheckpoint
    assert "self._save_model(" in inspect.getsource(base.on_epoch_end)
    assert "self._save_model(" in inspect.getsource(base.on_train_batch_end)
    assert ModelCheckpoint._save_model is not base._save_model


def test_saving_lib_internals_present():
    snapshots.check_keras_internals()  # raises, naming what is missing
    from keras.src.saving import saving_lib

    assert params(saving_lib._save_state) == [
        "saveable", "weights_store", "assets_store", "inner_path", "visited_saveables"
    ]
    assert params(saving_lib.H5IOStore.make) == ["self", "path", "metadata"]


def test_check_keras_internals_names_what_is_missing(monkeypatch):
    from keras.src.saving import saving_lib

    monkeypatch.delattr(saving_lib, "_save_state")
    monkeypatch.setattr(_keras_private, "_checked", {})  # require's cache: Keras changed under it
    with pytest.raises(RuntimeError, match=r"saving_lib\._save_state"):
        snapshots.check_keras_internals()
    with pytest.raises(RuntimeError, match="async_save"):
        ModelCheckpoint("m.keras", async_save=True)


class Vocabulary(keras.layers.Layer):
    """A layer with variables and an asset file, as lookup layers have."""

    def build(self, shape):
        self.table = self.add_weight(shape=(4, 2), initializer="ones", trainable=False, name="table")

    def call(self, x):
        return x

    def save_assets(self, dir_path):
        with open(f"{dir_path}/vocab.txt", "w") as f:
            f.write("a\nb\n")

    def load_assets(self, dir_path):
        pass


def trained_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(  # fixed names: two instances must serialize alike
        [keras.Input((3,), name="x"), Vocabulary(name="vocab"), keras.layers.Dense(4, name="d1"),
         keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(2, name="d2")],
        name="m",
    )
    model.compile(optimizer=keras.optimizers.Adam(name="adam"), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(16, 3)), rng.normal(size=(16, 2)), epochs=1, verbose=0)
    return model


def h5_content(data):
    """Every group, dataset and attribute of an HDF5 file, as comparable values."""
    out = {}
    with h5py.File(io.BytesIO(data), "r") as f:
        def visit(name, obj):
            attrs = {k: str(v) for k, v in obj.attrs.items()}
            value = obj[()].tobytes() if isinstance(obj, h5py.Dataset) else None
            out[name] = (type(obj).__name__, attrs, value)
        f.visititems(visit)
        out["/"] = {k: str(v) for k, v in f.attrs.items()}
    return out


@pytest.mark.slow  # a real fit
@pytest.mark.parametrize("kind", ["keras", "weights", "h5"])
def test_snapshot_writes_what_keras_writes(tmp_path, kind):
    model = trained_model()
    suffix = {"keras": ".keras", "weights": ".weights.h5", "h5": ".h5"}[kind]
    ours, theirs = tmp_path / f"ours{suffix}", tmp_path / f"theirs{suffix}"
    snapshot = snapshots.take_snapshot(model, kind)
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)  # training goes on: the copy must not move
    snapshot.write(str(ours))
    # Keras's own file of the same state, taken before the extra step
    keras_model = trained_model()
    if kind == "weights":
        keras_model.save_weights(theirs)
    else:
        keras_model.save(theirs)
    if kind == "keras":
        with zipfile.ZipFile(ours) as a, zipfile.ZipFile(theirs) as b:
            assert a.namelist() == b.namelist()
            assert "assets/layers/vocabulary/vocab.txt" in a.namelist()
            assert a.read("assets/layers/vocabulary/vocab.txt") == b.read("assets/layers/vocabulary/vocab.txt")
            assert json.loads(a.read("config.json")) == json.loads(b.read("config.json"))
            assert h5_content(a.read("model.weights.h5")) == h5_content(b.read("model.weights.h5"))
    elif kind == "weights":
        assert h5_content(ours.read_bytes()) == h5_content(theirs.read_bytes())
    else:
        assert h5_content(ours.read_bytes()) == h5_content(theirs.read_bytes())


@pytest.mark.slow  # a real fit
def test_snapshot_reads_the_variables_without_copying_them():
    """The training thread's share of a save: reads that share the variables' buffers."""
    import tensorflow as tf

    model = trained_model()
    for kind in ("keras", "weights"):
        snapshot = snapshots.take_snapshot(model, kind)
        held = [v for _, _, entry in snapshot.entries for v in entry.values()]
        variables = model.weights + model.optimizer.variables
        assert len(held) >= len(variables) and all(tf.is_tensor(v) for v in held)
        buffers = [np.asarray(tf.identity(v.value)) for v in variables]
        arrays = [np.asarray(v) for v in held]
        assert all(any(np.shares_memory(a, b) for a in arrays) for b in buffers if b.size)
