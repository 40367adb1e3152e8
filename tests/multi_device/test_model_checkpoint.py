"""`kmp.callbacks.ModelCheckpoint` over 2 replicas (the 2 logical CPUs of conftest.py).

Under MirroredStrategy the callback must write what Keras's callback writes, the
saved weights must be the trained (mirrored) ones to the bit, and the legacy
multi-GPU recipe (template + `multi_gpu_model` + `ParallelModelCheckpoint`)
must save the template holding the trained weights, without pickling anything.
"""

from __future__ import annotations

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import ModelCheckpoint, ParallelModelCheckpoint, events


def layers(seed=1):
    return [
        keras.Input((6,)),
        keras.layers.Dense(8, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(seed)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
    ]


@kmp.parallelize(strategy="mirrored")
def mirrored_model(seed=1):
    model = keras.Sequential(layers(seed), name="mirrored")
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    return model


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x @ rng.normal(size=(6, 1))).astype("float32")


def fit(model, callbacks, epochs=3):
    x, y = data()
    return model.fit(x, y, batch_size=16, epochs=epochs, validation_data=data(16, 1), shuffle=False,
                     verbose=0, callbacks=callbacks)


def assert_same_arrays(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_model_is_mirrored_over_two_replicas():
    assert mirrored_model().distribute_strategy.num_replicas_in_sync == 2


CASES = {
    "every_epoch": ("{epoch:02d}.keras", {}),
    "best_weights": ("best.weights.h5", {"save_weights_only": True, "save_best_only": True,
                                         "monitor": "val_mae"}),
    "every_3_batches": ("b{batch}.keras", {"save_freq": 3}),
}


def run(cls, folder, case, **extra):
    filepath, kwargs = CASES[case]
    keras.utils.set_random_seed(0)
    model = mirrored_model()
    fit(model, [cls(str(folder / filepath), **kwargs, **extra)], epochs=2)
    return model.get_weights()


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory):
    """Keras's own callback on each case, once: (folder, final weights)."""
    cache = {}

    def get(case):
        if case not in cache:
            folder = tmp_path_factory.mktemp(case)
            cache[case] = (folder, run(keras.callbacks.ModelCheckpoint, folder, case))
        return cache[case]

    return get


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_files_and_weights_as_keras_under_mirrored_strategy(tmp_path, case, async_save, keras_run):
    theirs, ref_weights = keras_run(case)
    weights = run(ModelCheckpoint, tmp_path, case, async_save=async_save)
    assert_same_arrays(weights, ref_weights)
    names = sorted(os.listdir(theirs))
    assert names and sorted(os.listdir(tmp_path)) == names
    weights_only = CASES[case][1].get("save_weights_only", False)
    for name in names:
        if weights_only:
            loaded = [mirrored_model(seed=7) for _ in range(2)]
            for model, folder in zip(loaded, (theirs, tmp_path), strict=True):
                model.load_weights(folder / name)
        else:
            loaded = [keras.saving.load_model(folder / name) for folder in (theirs, tmp_path)]
            assert_same_arrays(loaded[1].optimizer.variables, loaded[0].optimizer.variables)
        assert_same_arrays(loaded[1].get_weights(), loaded[0].get_weights())
    if case == "every_epoch":  # the last file holds the final mirrored weights
        assert_same_arrays(keras.saving.load_model(tmp_path / names[-1]).get_weights(), weights)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_template_receives_the_mirrored_weights(tmp_path, async_save):
    with tf.device("/cpu:0"):
        template = keras.Sequential(layers(seed=3), name="template")
    trained = mirrored_model()
    seen = []
    events.subscribe(trained, "checkpoint_saved", seen.append)
    callback = ModelCheckpoint(str(tmp_path / "t.keras"), model=template, async_save=async_save)
    fit(trained, [callback], epochs=2)
    assert_same_arrays(template.get_weights(), trained.get_weights())
    saved = keras.saving.load_model(tmp_path / "t.keras")
    assert saved.name == "template"
    assert_same_arrays(saved.get_weights(), trained.get_weights())
    assert [p["epoch"] for p in seen] == [0, 1]


def test_legacy_multi_gpu_recipe_saves_the_template(tmp_path):
    """The seed recipe: template on the CPU, multi_gpu_model, ParallelModelCheckpoint(model, path)."""
    with tf.device("/cpu:0"):
        model = keras.Sequential(layers(seed=5), name="template")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # logical CPUs instead of GPUs
        parallel_model = kmp.multi_gpu_model(model, gpus=2)
    parallel_model.compile(optimizer="sgd", loss="mse")
    checkpoint = ParallelModelCheckpoint(model, str(tmp_path / "my_model.h5"), monitor="val_loss",
                                         save_best_only=True)
    history = fit(parallel_model, [checkpoint], epochs=3)  # no "can't pickle" TypeError
    assert parallel_model.distribute_strategy.num_replicas_in_sync == 2
    assert_same_arrays(model.get_weights(), parallel_model.get_weights())
    saved = keras.saving.load_model(tmp_path / "my_model.h5", compile=False)
    assert saved.name == "template" and os.listdir(tmp_path) == ["my_model.h5"]
    val_loss = history.history["val_loss"]
    assert checkpoint.best == min(val_loss) == val_loss[-1]  # the last epoch was the best...
    assert_same_arrays(saved.get_weights(), parallel_model.get_weights())  # ...and is saved
