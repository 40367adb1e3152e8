"""`kmp.callbacks.BackupAndRestore` and stop signals, in one process (real signals, real fits).

A SIGTERM during `fit` becomes a backup before the next step (one process reads whether a
signal came at each batch's start) and `TrainingStopped` (exit code 75); the same `fit` again resumes mid-epoch and ends with the weights of an uninterrupted
run, Dropout's random state and the shuffled order included. The bad inputs: a signal
before the first step, a second signal, a signal during a backup, a backup of another
model or optimizer.
"""

from __future__ import annotations

import json
import os
import signal

import keras
import numpy as np
import pytest

from keras_mgpu_plugins import _stop_signals
from keras_mgpu_plugins.callbacks import BackupAndRestore, _training_state
from keras_mgpu_plugins.callbacks.backup_and_restore import BackupMismatchError
from keras_mgpu_plugins.errors import STOPPED_EXIT_CODE, TrainingStopped

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROWS, BATCH, EPOCHS = 48, 8, 3  # 6 batches per epoch


def build(optimizer="adam", units=8):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(units, activation="relu"),
        keras.layers.Dropout(0.3, seed=5), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.get(optimizer), loss="mse")
    return model


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


class Signal(keras.callbacks.Callback):
    """Sends this process `signals` after batch `at[1]` of epoch `at[0]`; records batches."""

    def __init__(self, at=None, signals=(signal.SIGTERM,), during=None):
        super().__init__()
        self.at, self.signals, self.trained = at, signals, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.trained.append((self.epoch, batch))
        if self.at == (self.epoch, batch):
            for s in self.signals:
                os.kill(os.getpid(), s)


def fit(model, callbacks, epochs=EPOCHS):
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=True, verbose=0,
              callbacks=callbacks)
    return np.concatenate([w.ravel() for w in model.get_weights()])


def metadata(folder):
    with open(os.path.join(folder, "training_metadata.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def uninterrupted():
    return fit(build(), [])


def stop(folder, at, **kwargs):
    """A fit stopped by SIGTERM after batch `at`: the exception."""
    with pytest.raises(TrainingStopped) as stopped:
        fit(build(), [BackupAndRestore(folder, **kwargs), Signal(at)])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers were undone
    return stopped.value


def test_sigterm_saves_the_next_step_and_a_rerun_ends_as_an_uninterrupted_run(
        tmp_path, uninterrupted, capfd):
    folder = str(tmp_path / "backup")
    stopped = stop(folder, (1, 2))
    assert (stopped.code, stopped.signal, stopped.saved) == (STOPPED_EXIT_CODE, "SIGTERM", True)
    assert (stopped.epoch, stopped.batches_done, stopped.backup_dir) == (1, 3, folder)
    err = capfd.readouterr().err
    assert ("kmp received SIGTERM: training stops before the next step, once BackupAndRestore "
            "has saved that step.") in err
    assert ("stopped by SIGTERM (received by worker 0) in epoch 2 (of the progress bar), after 3 "
            f"of its batches; BackupAndRestore saved that step in {folder}: run the same "
            "command again to resume (exit code 75).") in err
    record = metadata(folder)
    torch_lane = keras.backend.backend() == "torch"  # its global generators at the step too
    assert (record["epoch"], record["batch"], record["batches_done"]) == (1, 2, 3)
    assert set(record["training"]) == {"numpy_rng", "python_rng", "backend_rng", "data_order",
                                       "seed_generators", "structure", "world",
                                       *(["backend_rng_now"] if torch_lane else [])}

    seen = Signal()
    resumed = fit(build(), [BackupAndRestore(folder), seen])
    assert seen.trained[:4] == [(1, 3), (1, 4), (1, 5), (2, 0)]  # 3 drawn, seen by no callback
    np.testing.assert_array_equal(resumed, uninterrupted)  # bit-exact
    assert not os.path.exists(folder)


def test_without_its_random_state_dropout_would_draw_other_masks(tmp_path, uninterrupted,
                                                                 monkeypatch):
    """What the backup's `seed_generators` are for (Keras's weights file leaves them out)."""
    folder = str(tmp_path / "backup")
    stop(folder, (1, 2))
    monkeypatch.setattr(_training_state, "set_seed_generators", lambda *a: None)
    resumed = fit(build(), [BackupAndRestore(folder)])
    assert np.abs(resumed - uninterrupted).max() > 1e-3


def test_a_signal_before_the_first_step_stops_before_training(tmp_path):
    folder = str(tmp_path / "backup")
    undo = _stop_signals.install((signal.SIGTERM,))  # as kmp-launch's worker does
    _stop_signals.arm()  # as a fit that saves (the next one) will
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        seen = Signal()
        with pytest.raises(TrainingStopped, match="before the first step; nothing was trained"):
            fit(build(), [BackupAndRestore(folder), seen])
    finally:
        _stop_signals.disarm()
        undo()
    assert seen.trained == [] and not os.path.exists(folder)


def test_a_second_signal_is_said_and_the_stop_goes_on(tmp_path, capfd):
    folder = str(tmp_path / "backup")
    with pytest.raises(TrainingStopped):
        fit(build(), [BackupAndRestore(folder),
                      Signal((0, 1), signals=(signal.SIGUSR1, signal.SIGTERM))])
    assert "received SIGTERM again: already stopping" in capfd.readouterr().err
    assert metadata(folder)["batches_done"] == 2


def test_a_signal_during_a_backup_stops_once_that_backup_is_whole(tmp_path, monkeypatch):
    """The periodic backup of that very step is the one kept: no second write, no half file."""
    folder = str(tmp_path / "backup")
    writes = []
    write = BackupAndRestore._write

    def signalled_write(self, snapshot, state):
        writes.append(state.batches_done)
        if len(writes) == 2:  # the second periodic backup: the signal arrives while it writes
            os.kill(os.getpid(), signal.SIGTERM)
        write(self, snapshot, state)

    monkeypatch.setattr(BackupAndRestore, "_write", signalled_write)
    with pytest.raises(TrainingStopped) as stopped:
        fit(build(), [BackupAndRestore(folder, save_freq=2)])
    assert writes == [2, 4] and stopped.value.batches_done == 4  # stopped before the 5th
    assert sorted(os.listdir(folder)) == ["latest.weights.h5", "training_metadata.json"]


@pytest.mark.parametrize("other, message", [
    (dict(units=6), "weight 0 is 'sequential/dense/kernel' of shape (4, 8) in the backup, "
                    "'sequential_1/dense/kernel' of shape (4, 6) in this model"),
    (dict(optimizer="sgd"), "the backup's optimizer is Adam with 10 variables, this model's "
                            "is SGD with 2"),
])
def test_a_backup_of_another_model_or_optimizer_is_refused_before_loading(tmp_path, other,
                                                                          message):
    folder = str(tmp_path / "backup")
    stop(folder, (0, 1))
    with pytest.raises(BackupMismatchError) as refused:
        fit(build(**other), [BackupAndRestore(folder)])
    text = str(refused.value)
    assert text.startswith(f"The backup in backup_dir={folder!r} was written by another model "
                           "or optimizer: "), text
    assert message.split(" in the backup")[0].split("'sequential")[0] in text, text
    assert "To train from scratch, delete" in text


def test_stop_signals_keep_async_dispatch():
    assert BackupAndRestore("b", stop_signals=None).async_safe is True
    assert BackupAndRestore("b").async_safe is True  # the checks are at a batch's start
    assert BackupAndRestore("b", save_freq=3).async_safe is False  # backups at batch ends
    assert BackupAndRestore("b", stop_signals=["USR2", 15]).stop_signals == ("SIGUSR2", "SIGTERM")
    with pytest.raises(ValueError, match="not SIGKILL or SIGSTOP.*Received: stop_signals='KILL'"):
        BackupAndRestore("b", stop_signals="KILL")


def test_a_backup_keras_wrote_mid_epoch_restarts_that_epoch_as_keras_does(tmp_path):
    folder = tmp_path / "backup"
    model = build()
    fit(model, [keras.callbacks.BackupAndRestore(str(folder), save_freq=8,
                                                 delete_checkpoint=False)], epochs=2)
    assert metadata(folder) == {"epoch": 1, "batch": 1}  # no batches_done: Keras's own
    seen = Signal()
    fit(build(), [BackupAndRestore(str(folder)), seen])
    assert seen.trained[0] == (1, 0)


def test_at_an_epochs_last_batch_the_stop_waits_for_its_end(tmp_path, uninterrupted):
    """A resumed fit never skips every batch of an epoch (TensorFlow's epoch logs would fail:
    no metric built): the stop, and a periodic backup due then, come at the epoch's end."""
    folder = str(tmp_path / "backup")
    stopped = stop(folder, (1, 5), save_freq=6)  # the signal at the 6th of 6
    assert (stopped.epoch, stopped.batches_done) == (2, 0)
    assert "at the end of epoch 2;" in stopped.message
    assert (metadata(folder)["epoch"], metadata(folder)["batches_done"]) == (2, 0)
    seen = Signal()
    resumed = fit(build(), [BackupAndRestore(folder), seen])
    assert seen.trained[0] == (2, 0)
    np.testing.assert_array_equal(resumed, uninterrupted)


def test_after_a_fit_that_raised_a_stop_signal_stops_the_process_as_unarmed(tmp_path):
    """Keras calls no on_train_end when fit raises: kmp's handlers stay set and armed. A
    SIGTERM then (outside any fit) must not be taken for a stop request that no fit will
    act on (the process would ignore it until SIGKILL): it stops as unarmed, saying so."""

    class Boom(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fit(build(), [BackupAndRestore(str(tmp_path / "backup")), Boom()])
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # left set, as Keras leaves it
    with pytest.raises(TrainingStopped, match="nothing was saved") as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == 128 + signal.SIGTERM and _stop_signals.requested() is None
