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


def test_parallelize_refuses_to_distribute_on_torch():
    with pytest.raises(NotImplementedError, match="no distributed fit on the 'torch' backend"):
        kmp.parallelize(strategy="mirrored")
    with pytest.raises(NotImplementedError, match="kmp.simulate_devices"):
        kmp.simulate_devices(2)
    with pytest.raises(NotImplementedError, match="keras-team/keras#20753"):
        kmp.parallelize(strategy="parameter_server")
