"""The stop decision of `kmp.callbacks.EarlyStopping`, on numbers.

Keras's own rule decides (not re-implemented here); the callback's hooks are
driven beside Keras's own `EarlyStopping` on many value sequences, against a
stand-in model: both must agree epoch by epoch.
"""

from __future__ import annotations

import numpy as np
import pytest

from keras_mgpu_plugins.callbacks.early_stopping import EarlyStopping


def test_the_decision_is_kerass_own(monkeypatch):
    """Only the monitored value is ours (the chief's); the rule that reads it is Keras's:
    `on_epoch_end` only hands Keras's the epoch (its `get_weights` reading through the
    backend, see `test_best_weights_are_read_through_the_backend`)."""
    import keras

    assert EarlyStopping._is_improvement is keras.callbacks.EarlyStopping._is_improvement
    calls = []
    monkeypatch.setattr(keras.callbacks.EarlyStopping, "on_epoch_end",
                        lambda self, epoch, logs=None: calls.append((self, epoch, logs)))
    stopper, logs = EarlyStopping(restore_best_weights=True), {"val_loss": 1.0}
    stopper.set_model(StandInModel())
    stopper.on_epoch_end(3, logs)
    assert calls == [(stopper, 3, logs)]


def test_best_weights_are_read_through_the_backend(monkeypatch):
    """During Keras's hook (only), `model.get_weights()` is the backend's `host_value` of each
    weight: on JAX it also reads a variable sharded over several processes."""
    import keras

    from keras_mgpu_plugins import backends

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    read = []
    monkeypatch.setattr(backends.current(), "host_value",
                        lambda v: read.append(v.path) or np.full(v.shape, 7.0, "float32"))
    stopper = EarlyStopping(monitor="loss", restore_best_weights=True)
    stopper.set_model(model)
    stopper.on_train_begin()
    stopper.on_epoch_end(0, {"loss": 1.0})
    paths = [v.path for v in model.weights]
    assert read[: len(paths)] == paths and len(read) % len(paths) == 0  # Keras reads at most twice
    assert all((w == 7.0).all() for w in stopper.best_weights)
    assert "get_weights" not in vars(model)  # Keras's own again after the hook
    stopper.restore_best_weights, count = False, len(read)
    stopper.on_epoch_end(1, {"loss": 0.5})
    assert len(read) == count  # not read when not restoring


# --- the callback's hooks against Keras's, on many sequences ----------------------


class StandInModel:
    """Weights are the epoch number: restoring shows which epoch was kept."""

    def __init__(self):
        self.stop_training = False
        self.weights = -1

    def get_weights(self):
        return self.weights

    def set_weights(self, weights):
        self.weights = weights


def drive(callback, values, mode):
    import keras

    callback.set_model(StandInModel())
    if mode == "auto":  # no metrics to infer from: Keras picks "min" for a loss
        assert callback.monitor == "val_loss"
    callback.on_train_begin()
    seen = []
    for epoch, value in enumerate(values):
        callback.model.weights = epoch
        callback.on_epoch_end(epoch, logs={} if value is None else {"val_loss": value})
        seen.append((callback.wait, callback.best, callback.best_epoch))
        if callback.model.stop_training:
            break
    callback.on_train_end()
    assert isinstance(callback, keras.callbacks.EarlyStopping)
    return seen, callback.stopped_epoch, callback.model.weights


SETTINGS = [
    dict(patience=0),
    dict(patience=2, min_delta=0.05),
    dict(patience=3, baseline=0.3),
    dict(patience=1, start_from_epoch=3),
    dict(patience=2, mode="max", min_delta=0.01),
    dict(patience=4, baseline=0.9, mode="max", start_from_epoch=1),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("restore", [False, True])
def test_hooks_agree_with_keras_epoch_by_epoch(settings, restore):
    import warnings

    import keras

    rng = np.random.default_rng(len(str(settings)))
    stopped = []
    for trial in range(25):
        noise = rng.uniform(0.01, 1.0)
        values = list(np.round(rng.uniform(0, noise, size=12) + np.linspace(0.5, 0, 12), 2))
        values = [None if rng.uniform() < 0.1 else float(v) for v in values]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the missing-metric warning, from both
            ours = drive(EarlyStopping(restore_best_weights=restore, **settings), values,
                         settings.get("mode", "auto"))
            theirs = drive(keras.callbacks.EarlyStopping(restore_best_weights=restore, **settings),
                           values, settings.get("mode", "auto"))
        assert ours == theirs, (trial, values)
        stopped.append(ours[1])
    assert any(e > 0 for e in stopped)  # the sequences do make it stop


def test_attributes_changed_during_fit_count_as_in_keras():
    """Keras reads patience, best and wait at each epoch: a change mid-fit counts from then."""
    import keras

    def run(callback):
        callback.set_model(StandInModel())
        callback.on_train_begin()
        seen = []
        for epoch, value in enumerate([0.5, 0.4, 0.45, 0.44, 0.43, 0.42, 0.41, 0.40]):
            if epoch == 2:
                callback.patience = 3
            if epoch == 4:
                callback.best, callback.wait = 0.1, 0
            callback.on_epoch_end(epoch, {"val_loss": value})
            seen.append((callback.wait, callback.best, callback.best_epoch))
            if callback.model.stop_training:
                break
        return seen, callback.stopped_epoch

    ours, theirs = run(EarlyStopping(patience=1)), run(keras.callbacks.EarlyStopping(patience=1))
    assert ours == theirs
    assert theirs[1] == 6  # patience 3 from epoch 2; a best of 0.1 set at epoch 4 is never beaten


def test_missing_monitor_warns_like_keras():
    stopper = EarlyStopping(monitor="val_auc", mode="max")
    stopper.set_model(StandInModel())
    stopper.on_train_begin()
    with pytest.warns(UserWarning, match="`val_auc` which is not available. Available metrics are: loss"):
        stopper.on_epoch_end(0, logs={"loss": 1.0})
    assert stopper.best is None


@pytest.mark.parametrize(
    "settings, losses, stop_at, trained, kept",
    [
        # The best epoch is 2; patience 2 runs to epoch 4, then restores epoch 2.
        (dict(patience=2), [0.2, 0.15, 0.1, 0.11, 0.12], None, 5, 2),
        # Nothing beats the baseline: 5 epochs (patience), the best of them kept.
        (dict(patience=5, baseline=0.5), [0.9, 0.8, 0.7, 0.71, 0.72, 0.73], None, 5, 2),
        # Another callback stops training at epoch 3: the best epoch is still restored.
        (dict(patience=5, baseline=0.5), [0.9, 0.8, 0.7, 0.71, 0.72, 0.73], 3, 4, 2),
    ],
)
def test_restore_best_weights_keeps_the_best_epoch(settings, losses, stop_at, trained, kept):
    stopper = EarlyStopping(monitor="val_loss", restore_best_weights=True, **settings)
    stopper.set_model(StandInModel())
    stopper.on_train_begin()
    epochs_trained = 0
    for epoch, loss in enumerate(losses):
        epochs_trained += 1
        stopper.model.weights = epoch
        stopper.on_epoch_end(epoch, logs={"val_loss": loss})
        if epoch == stop_at:
            stopper.model.stop_training = True
        if stopper.model.stop_training:
            break
    stopper.on_train_end()
    assert (epochs_trained, stopper.model.get_weights()) == (trained, kept)
