"""`kmp.callbacks.EarlyStopping` with 2 real workers (`kmp.launch`).

Both workers stop at the same epoch, restore the same weights to the bit, and
agree with one process on the same global batches; and when the monitored value
differs between workers (a metric no one reduces), both follow the chief's and
neither is left waiting in a collective.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]

GLOBAL_BATCH = 16
EPOCHS = 8
CUSTOM_EPOCHS = 4  # the "custom" runs: enough for worker 1's own value to stop it at epoch 1
# Per-worker values of a "custom" log entry: each would stop at a different epoch alone.
FALLING = [5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.25, 0.125]  # always improves: never stops
RISING = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]  # stops at epoch 1 (patience 0)


def make_data(n=64):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 5)).astype("float32")
    y = (x[:, :1] + rng.normal(size=(n, 1))).astype("float32")  # half noise: val_loss stalls
    return x, y


def build_model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(8, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(1)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2)),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.3), loss="mse")
    return model


def fit(model, callbacks, epochs=EPOCHS):
    x, y = make_data()
    history = model.fit(x, y, validation_data=(x[48:], y[48:]), batch_size=GLOBAL_BATCH,
                        epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return history.epoch


def per_worker_custom(values_by_worker):
    import keras

    class SetCustom(keras.callbacks.Callback):
        """Puts this worker's own value in the logs, as an unreduced metric would."""

        def on_epoch_end(self, epoch, logs=None):
            logs["custom"] = values_by_worker[kmp.topology().worker_index][epoch]

    return SetCustom()


def train_on_worker():
    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks import EarlyStopping

    # One model for every run, reset to its initial weights (plain SGD keeps no state): its
    # train and test functions are traced once, not once per run.
    model = kmp.parallelize(build_model)()
    initial = model.get_weights()
    out = {}
    stopper = EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    out["val_loss"] = {"epochs": fit(model, [stopper]), "stopped": stopper.stopped_epoch,
                       "best_epoch": stopper.best_epoch, "weights": model.get_weights()}
    for name, values in (("chief_falls", (FALLING, RISING)), ("chief_rises", (RISING, FALLING))):
        stopper = EarlyStopping(monitor="custom", mode="min", patience=0, restore_best_weights=True)
        model.set_weights(initial)
        epochs = fit(model, [per_worker_custom(values), stopper], epochs=CUSTOM_EPOCHS)
        out[name] = {"epochs": epochs, "stopped": stopper.stopped_epoch, "best": stopper.best,
                     "best_epoch": stopper.best_epoch, "weights": model.get_weights()}
    # Arguments that differ between workers: both raise in on_train_begin, nothing trains.
    stopper = EarlyStopping(monitor="val_loss", patience=1 + kmp.topology().worker_index)
    try:
        out["differing"] = {"epochs": fit(model, [stopper])}
    except ValueError as err:
        out["differing"] = {"error": f"{type(err).__name__}: {err}"}
    return out


@pytest.fixture(scope="module")
def results():
    return kmp.launch(train_on_worker, num_workers=2, timeout=200)


def assert_bit_identical(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        assert np.array_equal(a, b)


def test_both_workers_stop_at_the_same_epoch_with_identical_weights(results):
    chief, worker = results[0]["val_loss"], results[1]["val_loss"]
    assert chief["stopped"] == worker["stopped"] > chief["best_epoch"] == worker["best_epoch"]
    assert chief["epochs"] == worker["epochs"] == list(range(chief["stopped"] + 1))
    assert_bit_identical(chief["weights"], worker["weights"])


def test_same_decision_and_weights_as_one_process(results):
    import keras

    from keras_mgpu_plugins.callbacks import EarlyStopping

    keras.utils.set_random_seed(0)
    model = build_model()
    stopper = EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    epochs = fit(model, [stopper])
    chief = results[0]["val_loss"]
    assert (chief["epochs"], chief["stopped"], chief["best_epoch"]) == (
        epochs, stopper.stopped_epoch, stopper.best_epoch)
    for a, b in zip(chief["weights"], model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_chief_value_decides_when_it_keeps_improving(results):
    # Worker 1's own value would stop it at epoch 1; the chief's never stops.
    chief, worker = results[0]["chief_falls"], results[1]["chief_falls"]
    assert chief["epochs"] == worker["epochs"] == list(range(CUSTOM_EPOCHS))
    assert chief["stopped"] == worker["stopped"] == 0
    assert chief["best"] == worker["best"] == FALLING[CUSTOM_EPOCHS - 1]
    assert_bit_identical(chief["weights"], worker["weights"])


def test_chief_value_decides_when_it_stops_first(results):
    # The chief's value stops training at epoch 1; worker 1's would never stop.
    chief, worker = results[0]["chief_rises"], results[1]["chief_rises"]
    assert chief["epochs"] == worker["epochs"] == [0, 1]
    assert chief["stopped"] == worker["stopped"] == 1
    assert chief["best"] == worker["best"] == RISING[0]
    assert chief["best_epoch"] == worker["best_epoch"] == 0
    assert_bit_identical(chief["weights"], worker["weights"])


def keras_stopper_on_worker():
    import keras

    model = kmp.parallelize(build_model)()
    stopper = keras.callbacks.EarlyStopping(monitor="custom", mode="min", patience=0)
    return fit(model, [per_worker_custom((RISING, FALLING)), stopper])


def test_keras_own_early_stopping_splits_the_workers():
    """Why the broadcast is needed: Keras's callback stops the chief alone at epoch 1;
    worker 1 is left in a collective whose peer is gone (an error, or a hang)."""
    from keras_mgpu_plugins.launch import LaunchTimeoutError, WorkerFailedError

    with pytest.raises((WorkerFailedError, LaunchTimeoutError)):
        kmp.launch(keras_stopper_on_worker, num_workers=2, timeout=90)


def test_differing_arguments_stop_both_workers_before_training(results):
    for rank, r in enumerate(results):
        assert r["differing"] == {"error": (
            "SettingsDifferError: EarlyStopping must be created with the same arguments on "
            "every worker: they decide where it runs collective operations, and a worker that "
            f"runs fewer would leave the others waiting. Differing: patience (here {1 + rank}; "
            "differs from the chief's on worker(s) 1).")}
