"""Every kmp callback on the torch backend, in one process, against Keras's own callbacks:
the same files, the same epochs, the same weights (a fresh model per run, seeded)."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp

ROWS, BATCH, EPOCHS = 64, 16, 4


def data() -> tuple:
    x = np.random.default_rng(0).normal(size=(ROWS, 4)).astype("float32")
    return x, (x.sum(1, keepdims=True) > 0).astype("float32")


def model() -> keras.Model:
    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    built.compile(keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    return built


def train(folder, callbacks: list) -> tuple:
    x, y = data()
    built = kmp.parallelize(model)()  # one device: the factory as is
    history = built.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=callbacks, verbose=0,
                        shuffle=False)
    return built, history, sorted(os.listdir(folder))


def test_checkpoint_and_early_stopping_do_what_keras_does(tmp_path):
    mine, theirs = tmp_path / "kmp", tmp_path / "keras"
    mine.mkdir(), theirs.mkdir()
    kmp_model, kmp_history, kmp_files = train(mine, [
        kmp.callbacks.ModelCheckpoint(str(mine / "m-{epoch}.keras"), monitor="loss",
                                      save_best_only=True),
        kmp.callbacks.EarlyStopping(monitor="loss", min_delta=0.05, patience=1,
                                    restore_best_weights=True)])
    keras_model, keras_history, keras_files = train(theirs, [
        keras.callbacks.ModelCheckpoint(str(theirs / "m-{epoch}.keras"), monitor="loss",
                                        save_best_only=True),
        keras.callbacks.EarlyStopping(monitor="loss", min_delta=0.05, patience=1,
                                      restore_best_weights=True)])
    assert kmp_files == keras_files and kmp_files
    assert kmp_history.epoch == keras_history.epoch
    for a, b in zip(kmp_model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for name in kmp_files:
        loaded, expected = (keras.saving.load_model(str(d / name)) for d in (mine, theirs))
        for a, b in zip(loaded.get_weights(), expected.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)


def test_every_callback_runs_in_one_process(tmp_path):
    os.environ.setdefault("WANDB_MODE", "offline")
    from keras_mgpu_plugins.integrations.wandb import WandbLogger

    built, history, files = train(tmp_path, [
        kmp.callbacks.ModelCheckpoint(str(tmp_path / "w.weights.h5"), save_weights_only=True,
                                      async_save=True),
        kmp.callbacks.BackupAndRestore(str(tmp_path / "backup")),
        kmp.callbacks.WeightSyncVerifier(),
        kmp.callbacks.DeviceMetricsLogger(batch_size=BATCH),
        kmp.callbacks.StallWatchdog(timeout=120),
        WandbLogger(project="torch-one-process", dir=str(tmp_path))])
    assert history.epoch == list(range(EPOCHS))
    assert files == ["w.weights.h5", "wandb"]  # the backup folder removed at the end
    reloaded = model()
    reloaded.load_weights(str(tmp_path / "w.weights.h5"))
    for a, b in zip(reloaded.get_weights(), built.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert {"step_time/mean_ms", "loss"} <= set(history.history)  # DeviceMetricsLogger's


@pytest.mark.parametrize("arguments, setting", [
    ({"strategy": "model_parallel"}, "strategy='model_parallel'"),
    ({"strategy": "hybrid"}, "strategy='hybrid'"),
    ({"strategy": "model_parallel", "layout_map": object()}, "layout_map"),
    ({"micro_batches": 2}, "micro_batches"),
    ({"devices": ["GPU:0", "GPU:1"]}, "devices"),
    ({"strategy": "parameter_server"}, "strategy='parameter_server'"),
    ({"variable_partitioner": "auto", "max_shards": 2}, "variable_partitioner"),
])
def test_what_torch_cannot_run_alike_is_refused_at_the_decorator(arguments, setting):
    with pytest.raises(ValueError, match=setting.replace("(", r"\(")) as caught:
        kmp.parallelize(**arguments)
    assert "torch backend" in str(caught.value)
    if "parameter_server" in setting or "partitioner" in setting:
        assert "KERAS_BACKEND=tensorflow" in str(caught.value)
        assert "keras-team/keras#20753" in str(caught.value)
    if "model_parallel" in setting or "hybrid" in setting or "layout_map" in setting:
        assert "keras-team/keras#23418" in str(caught.value)
        assert "KERAS_BACKEND=jax" in str(caught.value)


def test_a_tensorflow_strategy_object_is_refused_naming_the_backend():
    class MirroredStrategy:  # what tf.distribute.MirroredStrategy() would be
        pass

    with pytest.raises(ValueError, match="tf.distribute.*torch backend.*strategy='auto'"):
        kmp.parallelize(strategy=MirroredStrategy())


def test_one_process_with_several_gpus_trains_on_one_and_says_how_to_use_all(monkeypatch):
    from keras_mgpu_plugins.backends.torch import devices

    monkeypatch.setattr(devices, "local_device_names", lambda: ("GPU:0", "GPU:1"))
    monkeypatch.setattr(devices, "device_name", lambda: "GPU:0")
    with pytest.warns(UserWarning, match="kmp-launch -n 2 train.py"):
        assert kmp.parallelize(lambda: "model")() == "model"
    with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
        kmp.parallelize(strategy="mirrored")(lambda: "model")()
    assert kmp.parallelize(strategy="default")(lambda: "model")() == "model"
