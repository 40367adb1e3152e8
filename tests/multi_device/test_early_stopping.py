"""`kmp.callbacks.EarlyStopping` in one process: Keras's own tests, a fit-by-fit
comparison with `keras.callbacks.EarlyStopping`, and restored weights on every
replica of 2 logical devices."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import ops

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import EarlyStopping


def small_model(seed=1, metrics=("mae",), lr=0.3):
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(8, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse", metrics=list(metrics))
    return model


def noisy_data(n=32, seed=0):
    """Targets that are half noise: the validation loss soon stops improving."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype("float32")
    y = (x[:, :1] + rng.normal(size=(n, 1))).astype("float32")
    return x, y


def test_mode_inference_as_keras():
    x, y = noisy_data(10)
    model = keras.Sequential([keras.layers.Dense(1, activation="relu"), keras.layers.Dense(1)])
    model.compile(loss="mae", optimizer="adam",
                  metrics=["mse", "acc", "accuracy", "hinge", keras.metrics.F1Score(name="f1_score")])
    cases = [
        ("max", "val_mse", ops.greater), ("min", "val_loss", ops.less),
        ("auto", "val_mse", ops.less), ("auto", "loss", ops.less),
        ("auto", "acc", ops.greater), ("auto", "val_accuracy", ops.greater),
        ("auto", "hinge", ops.less), ("auto", "f1_score", ops.greater),
    ]
    for mode, monitor, expected in cases:
        stopper = EarlyStopping(patience=0, monitor=monitor, mode=mode)
        model.fit(x, y, batch_size=5, validation_data=(x, y), callbacks=[stopper], epochs=2, verbose=0)
        assert stopper.monitor_op == expected, (mode, monitor)
    with pytest.raises(ValueError, match="isn't able to automatically determine"):
        model.fit(x, y, batch_size=5, validation_data=(x, y), epochs=2, verbose=0,
                  callbacks=[EarlyStopping(patience=0, monitor="unknown")])


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_patience_through_the_hooks_of_a_compiled_model(patience):
    stopper = EarlyStopping(monitor="loss", patience=patience)
    stopper.set_model(keras.Sequential())
    stopper.model.compile(loss="mse", optimizer="sgd")
    stopper.on_train_begin()
    for epoch, loss in enumerate([10.0, 9.0, 8.0, 9.0, 8.9, 8.8, 8.7, 8.6, 8.5]):
        stopper.on_epoch_end(epoch=epoch, logs={"loss": loss})
        if stopper.model.stop_training:
            break
    assert stopper.stopped_epoch == max(patience, 1) + 2


def test_reuse_across_fit_calls_and_models():
    x, y = noisy_data(64)
    stopper = EarlyStopping(monitor="val_loss", patience=1)
    runs = []
    for seed in (1, 1, 5):  # the same model twice, then another: each fit starts afresh
        keras.utils.set_random_seed(0)
        model = small_model(seed)
        history = model.fit(x, y, validation_data=(x[:16], y[:16]), epochs=20, batch_size=8,
                            shuffle=False, verbose=0, callbacks=[stopper])
        runs.append((len(history.epoch), stopper.stopped_epoch, stopper.best))
        assert stopper.best == min(history.history["val_loss"])
    assert runs[0] == runs[1]
    assert all(stopped > 0 for _, stopped, _ in runs)


def test_reuse_on_the_same_model_stops_again():
    x, y = noisy_data(64)
    model = small_model()
    stopper = EarlyStopping(monitor="mae", patience=3)
    for _ in range(2):
        history = model.fit(x, y, epochs=20, batch_size=8, verbose=0, callbacks=[stopper])
        assert len(history.epoch) >= 3


def test_baseline_and_start_from_epoch_in_fit():
    x, y = noisy_data(64)
    stopper = EarlyStopping(monitor="mae", patience=3, baseline=0.0)
    history = small_model().fit(x, y, epochs=20, batch_size=8, verbose=0, callbacks=[stopper])
    # Nothing beats a mae of 0: the wait is never reset, training stops once the mae stalls.
    assert 3 <= len(history.epoch) < 20 and stopper.stopped_epoch == history.epoch[-1]
    assert stopper.best == min(history.history["mae"])
    for start, patience in ((2, 3), (2, 0)):
        stopper = EarlyStopping(monitor="mae", patience=patience, baseline=0.0,
                                start_from_epoch=start)
        history = small_model().fit(x, y, epochs=20, batch_size=8, verbose=0, callbacks=[stopper])
        assert len(history.epoch) >= start + patience
        assert stopper.best == min(history.history["mae"][start:])


# --- the same fit, with Keras's EarlyStopping and with ours -------------------------

CASES = [
    dict(monitor="val_loss", patience=0),
    dict(monitor="val_loss", patience=1, restore_best_weights=True),
    dict(monitor="val_mae", patience=2, min_delta=0.02, restore_best_weights=True),
    dict(monitor="loss", patience=1, baseline=0.3, restore_best_weights=True),
    dict(monitor="val_loss", patience=1, start_from_epoch=3, restore_best_weights=True),
    dict(monitor="val_mae", mode="max", patience=2, restore_best_weights=True),
]


def fit_with(callback_class, settings):
    keras.utils.set_random_seed(0)
    x, y = noisy_data(64)
    model = small_model()
    stopper = callback_class(**settings)
    history = model.fit(x, y, validation_data=(x[48:], y[48:]), epochs=15, batch_size=8,
                        shuffle=False, verbose=0, callbacks=[stopper])
    return stopper, history, model.get_weights()


@pytest.mark.parametrize("settings", CASES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_same_fit_same_outcome_as_keras(settings):
    ours, our_history, our_weights = fit_with(EarlyStopping, settings)
    theirs, their_history, their_weights = fit_with(keras.callbacks.EarlyStopping, settings)
    assert our_history.history == their_history.history
    assert ours.stopped_epoch == theirs.stopped_epoch
    assert (ours.best, ours.best_epoch, ours.wait) == (theirs.best, theirs.best_epoch, theirs.wait)
    assert len(our_weights) == len(their_weights)
    for a, b in zip(our_weights, their_weights, strict=True):
        assert np.array_equal(a, b)
    if settings == CASES[0]:
        assert ours.stopped_epoch > 0  # the data do make it stop early


def test_verbose_messages_as_keras(capsys):
    settings = dict(monitor="val_loss", patience=0, verbose=1, restore_best_weights=True)
    fit_with(keras.callbacks.EarlyStopping, settings)
    theirs = capsys.readouterr().out
    stopper, _, _ = fit_with(EarlyStopping, settings)
    ours = capsys.readouterr().out
    assert ours == theirs
    assert f"Epoch {stopper.stopped_epoch + 1}: early stopping" in ours
    assert f"Restoring model weights from the end of the best epoch: {stopper.best_epoch + 1}." in ours


# --- 2 replicas (logical devices): the restored weights are the same everywhere ------


class WeightsAtEpochEnd(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append(self.model.get_weights())


def replica_values(variable, strategy):
    return [np.asarray(v) for v in strategy.experimental_local_results(variable.value)]


def test_restore_best_weights_on_every_replica_to_the_bit():
    build = kmp.parallelize(strategy="mirrored")(small_model)
    model = build()
    strategy = model.distribute_strategy
    assert strategy.num_replicas_in_sync == 2
    x, y = noisy_data(64)
    recorder, stopper = WeightsAtEpochEnd(), EarlyStopping(patience=1, restore_best_weights=True)
    model.fit(x, y, validation_data=(x[48:], y[48:]), epochs=15, batch_size=8, shuffle=False,
              verbose=0, callbacks=[recorder, stopper])
    assert stopper.stopped_epoch > stopper.best_epoch  # later epochs were trained, then undone
    best = recorder.weights[stopper.best_epoch]
    last = recorder.weights[-1]
    assert any(not np.array_equal(a, b) for a, b in zip(best, last, strict=True))
    for variable, expected in zip(model.weights, best, strict=True):
        copies = replica_values(variable, strategy)
        assert len(copies) == 2
        for copy in copies:
            assert np.array_equal(copy, expected), variable.path
    for variable in model.optimizer.variables:
        first, second = replica_values(variable, strategy)
        assert np.array_equal(first, second), variable.path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kerass_own_early_stopping_tests_pass_on_ours(monkeypatch):
    """Keras's own test case (shipped with Keras), run with kmp's class in place of Keras's."""
    import importlib
    import io
    import types
    import unittest

    try:
        module = importlib.import_module("keras.src.callbacks.early_stopping_test")
    except ImportError:
        pytest.skip("this Keras ships without its tests")
    monkeypatch.setattr(module, "callbacks", types.SimpleNamespace(EarlyStopping=EarlyStopping))
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(module.EarlyStoppingTest)
    result = unittest.TextTestRunner(stream=io.StringIO()).run(suite)
    assert result.testsRun >= 5
    assert result.wasSuccessful(), [str(e[1])[-1500:] for e in result.failures + result.errors]
