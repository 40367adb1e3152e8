"""`kmp.callbacks.BackupAndRestore` in one process: Keras's own tests, Keras's file
layout both ways, torn and truncated backups, and 2 replicas (logical devices)."""

from __future__ import annotations

import json
import os
import shutil

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import BackupAndRestore


class Interrupt(keras.callbacks.Callback):
    """Raises after `epochs` epochs or `steps` batches, as a crash would."""

    def __init__(self, steps=None, epochs=None):
        super().__init__()
        self.steps, self.epochs = steps, epochs
        self.batch_count = self.epoch_count = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_count += 1
        if self.epoch_count == self.epochs:
            raise RuntimeError("EpochInterruption")

    def on_batch_end(self, batch, logs=None):
        self.batch_count += 1
        if self.batch_count == self.steps:
            raise RuntimeError("StepsInterruption")


class Canary(keras.layers.Layer):
    """Counts the batches it has seen, in a variable the backup keeps."""

    def __init__(self):
        super().__init__()
        self.counter = self.add_weight(shape=(), initializer="zeros", dtype="float32",
                                       trainable=False)

    def call(self, x):
        self.counter.assign_add(1)
        return x


class EpochsRun(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def canary_model():
    model = keras.Sequential([keras.Input((3,)), Canary(), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd", metrics=["mse"])
    return model


def seeded_model():
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(1)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2)),
        ]
    )
    model.compile(loss="mse", optimizer=keras.optimizers.Adam(0.05))
    return model


def data(n=10):
    rng = np.random.default_rng(0)
    return rng.random((n, 3)).astype("float32"), rng.random((n, 1)).astype("float32")


def counter(model):
    return int(model.layers[0].counter.numpy())


# --- Keras's own tests ----------------------------------------------------------------


def test_resumes_after_an_interruption_mid_epoch(tmp_path):
    backup_dir = str(tmp_path / "subdir")
    model, (x, y) = canary_model(), data()
    backup = BackupAndRestore(backup_dir, save_freq=1)
    with pytest.raises(RuntimeError, match="StepsInterruption"):
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[backup, Interrupt(steps=2)])
    assert os.path.exists(backup_dir)
    assert (backup._current_epoch, backup._last_batch_seen, counter(model)) == (0, 1, 2)
    with open(os.path.join(backup_dir, "training_metadata.json")) as f:
        assert json.load(f)["batch"] == 1
    history = model.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[backup])
    assert (backup._current_epoch, history.epoch) == (5, [0, 1, 2, 3, 4])
    # restored after 2 batches, the epoch goes on at its third: 15 steps in all, as an
    # uninterrupted run (Keras restarts the epoch: 2 + 5 * 3)
    assert counter(model) == 5 * 3
    assert not os.path.exists(backup_dir)


def test_resumes_after_an_interruption_at_an_epoch_end(tmp_path):
    backup_dir = str(tmp_path / "subdir")
    model, (x, y) = canary_model(), data()
    backup = BackupAndRestore(backup_dir=backup_dir, save_freq="epoch")
    with pytest.raises(RuntimeError, match="EpochInterruption"):
        model.fit(x, y, batch_size=4, epochs=6, verbose=0, callbacks=[backup, Interrupt(epochs=2)])
    assert (backup._current_epoch, counter(model)) == (2, 6)
    assert sorted(os.listdir(backup_dir)) == ["latest.weights.h5", "training_metadata.json"]
    epochs = EpochsRun()
    history = model.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[backup, epochs])
    assert (epochs.epochs, history.epoch) == ([2, 3, 4], [2, 3, 4])
    assert (backup._current_epoch, counter(model)) == (5, 5 * 3)


def test_corrupt_latest_backup_falls_back_to_the_previous(tmp_path):
    backup_dir = str(tmp_path / "subdir")
    model, (x, y) = canary_model(), data()
    backup = BackupAndRestore(backup_dir=backup_dir, save_freq="epoch", double_checkpoint=True)
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=4, epochs=6, verbose=0, callbacks=[backup, Interrupt(epochs=2)])
    for path in (backup._weights_path, backup._training_metadata_path,
                 backup._prev_weights_path, backup._prev_training_metadata_path):
        assert os.path.exists(path), path
    with open(backup._weights_path, "w") as f:
        f.write("0")
    epochs = EpochsRun()
    history = model.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[backup, epochs])
    assert epochs.epochs[0] == 1  # the previous backup: the end of epoch 0
    assert (backup._current_epoch, history.epoch[-1], counter(model)) == (5, 4, 5 * 3)


def test_backup_deleted_when_training_completes(tmp_path):
    backup_dir = str(tmp_path / "subdir")
    model, (x, y) = canary_model(), data()
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[BackupAndRestore(backup_dir)])
    assert not os.path.exists(backup_dir)


def test_kept_when_asked(tmp_path):
    backup_dir = str(tmp_path / "subdir")
    model, (x, y) = canary_model(), data()
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[BackupAndRestore(backup_dir, delete_checkpoint=False)])
    with open(os.path.join(backup_dir, "training_metadata.json")) as f:
        assert json.load(f)["epoch"] == 2
    restored = canary_model()
    restored.load_weights(os.path.join(backup_dir, "latest.weights.h5"))
    for a, b in zip(restored.get_weights(), model.get_weights(), strict=True):
        assert np.array_equal(a, b)


def test_unbuilt_model_raises_as_keras(tmp_path):
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
    backup = BackupAndRestore(str(tmp_path))
    backup.set_model(model)
    with pytest.raises(ValueError, match="you model must be built before you call `fit\\(\\)`"):
        backup.on_train_begin()


# --- Keras's files, both ways ---------------------------------------------------------


@pytest.mark.parametrize("writer, reader", [
    (BackupAndRestore, keras.callbacks.BackupAndRestore),
    (keras.callbacks.BackupAndRestore, BackupAndRestore),
])
def test_backups_interchange_with_keras(tmp_path, writer, reader):
    model, (x, y) = canary_model(), data()
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=4, epochs=6, verbose=0,
                  callbacks=[writer(str(tmp_path)), Interrupt(epochs=3)])
    epochs = EpochsRun()
    fresh = canary_model()
    fresh.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[reader(str(tmp_path)), epochs])
    assert epochs.epochs == [3, 4]
    assert counter(fresh) == 5 * 3


def test_same_weights_as_an_uninterrupted_run_and_no_temporary_files(tmp_path):
    (x, y), backup_dir = data(32), str(tmp_path / "b")
    keras.utils.set_random_seed(0)
    straight = seeded_model()
    straight.fit(x, y, batch_size=8, epochs=6, shuffle=False, verbose=0)
    model = seeded_model()
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=8, epochs=6, shuffle=False, verbose=0,
                  callbacks=[BackupAndRestore(backup_dir), Interrupt(epochs=4)])
    assert sorted(os.listdir(backup_dir)) == ["latest.weights.h5", "training_metadata.json"]
    resumed = seeded_model()  # a new process would build a new model
    epochs = EpochsRun()
    resumed.fit(x, y, batch_size=8, epochs=6, shuffle=False, verbose=0,
                callbacks=[BackupAndRestore(backup_dir), epochs])
    assert epochs.epochs == [4, 5]
    for a, b in zip(resumed.get_weights(), straight.get_weights(), strict=True):
        assert np.array_equal(a, b)


# --- torn and truncated backups ---------------------------------------------------------


def test_crash_between_metadata_and_weights_resumes_from_the_weights_on_disk(tmp_path):
    """The chief replaces the metadata first, then the weights. A crash between
    leaves the new metadata beside the old weights: restore the old state."""
    model, (x, y) = canary_model(), data()
    backup = BackupAndRestore(str(tmp_path), double_checkpoint=True)
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=4, epochs=6, verbose=0, callbacks=[backup, Interrupt(epochs=3)])
    shutil.copyfile(backup._prev_weights_path, backup._weights_path)  # weights of epoch 2, metadata of 3
    os.remove(backup._prev_weights_path)
    os.remove(backup._prev_training_metadata_path)
    epochs, fresh = EpochsRun(), canary_model()
    fresh.fit(x, y, batch_size=4, epochs=4, verbose=0,
              callbacks=[BackupAndRestore(str(tmp_path)), epochs])
    assert epochs.epochs == [2, 3]
    assert counter(fresh) == 4 * 3


def test_truncated_backup_without_a_previous_one_raises(tmp_path):
    model, (x, y) = canary_model(), data()
    backup = BackupAndRestore(str(tmp_path))
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=4, epochs=6, verbose=0, callbacks=[backup, Interrupt(epochs=2)])
    size = os.path.getsize(backup._weights_path)
    with open(backup._weights_path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(OSError, match="no valid previous backup") as err:
        canary_model().fit(x, y, batch_size=4, epochs=4, verbose=0,
                           callbacks=[BackupAndRestore(str(tmp_path))])
    assert f"its weights file {backup._weights_path} does not match" in str(err.value)
    assert str(err.value).endswith(f"To train from scratch, delete {tmp_path} (or move it "
                                   "away to keep the files), or pass another backup_dir.")


def test_a_backup_that_cannot_be_loaded_names_the_file_the_cause_and_the_way_out(tmp_path):
    """Weights that match their metadata but are no HDF5 file: the load itself fails."""
    from keras_mgpu_plugins.io.backup_state import sha256

    model, (x, y) = canary_model(), data()
    backup = BackupAndRestore(str(tmp_path))
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=4, epochs=6, verbose=0, callbacks=[backup, Interrupt(epochs=2)])
    with open(backup._weights_path, "wb") as f:
        f.write(b"not an HDF5 file")
    with open(backup._training_metadata_path) as f:
        metadata = json.load(f)
    with open(backup._training_metadata_path, "w") as f:
        json.dump({**metadata, "weights_sha256": sha256(backup._weights_path)}, f)
    with pytest.raises(OSError) as err:
        canary_model().fit(x, y, batch_size=4, epochs=4, verbose=0,
                           callbacks=[BackupAndRestore(str(tmp_path))])
    assert str(err.value).startswith(f"Unable to load the backup {backup._weights_path}: ")
    assert str(err.value).endswith(f"To train from scratch, delete {tmp_path} (or move it "
                                   "away to keep the files), or pass another backup_dir.")


# --- 2 replicas ---------------------------------------------------------------------


def replica_values(variable, strategy):
    return [np.asarray(v) for v in strategy.experimental_local_results(variable.value)]


def test_two_replicas_resume_with_identical_copies_and_the_uninterrupted_weights(tmp_path):
    build = kmp.parallelize(strategy="mirrored")(seeded_model)
    (x, y), backup_dir = data(32), str(tmp_path / "b")
    straight = build()
    straight.fit(x, y, batch_size=8, epochs=5, shuffle=False, verbose=0)
    model = build()
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=8, epochs=5, shuffle=False, verbose=0,
                  callbacks=[BackupAndRestore(backup_dir), Interrupt(epochs=3)])
    resumed, epochs = build(), EpochsRun()
    assert resumed.distribute_strategy.num_replicas_in_sync == 2
    resumed.fit(x, y, batch_size=8, epochs=5, shuffle=False, verbose=0,
                callbacks=[BackupAndRestore(backup_dir), epochs])
    assert epochs.epochs == [3, 4]
    for variable, expected in zip(resumed.weights, straight.get_weights(), strict=True):
        first, second = replica_values(variable, resumed.distribute_strategy)
        assert np.array_equal(first, second), variable.path
        np.testing.assert_allclose(first, expected, atol=1e-6)
