"""Every worker's `fit` must be given the same kmp callbacks (`_same_callbacks`), on 2 real workers.

The tf.keras idiom `callbacks=[ModelCheckpoint(...)] if chief else []` makes the
chief run collectives the other worker never runs: without the check the job
hangs at the first one. With it, both workers raise at train begin, naming the
callbacks, and the next `fit` with the same callbacks everywhere trains.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins import _same_callbacks

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(240)]


def chief_only_checkpoint_then_the_same_everywhere(directory):
    import keras

    from keras_mgpu_plugins.callbacks import EarlyStopping, ModelCheckpoint

    @kmp.parallelize
    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    model = build()
    chief = kmp.topology().is_chief
    x = np.ones((64, 4), "float32")
    checkpoint = ModelCheckpoint(f"{directory}/best.keras")
    try:
        model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0,
                  callbacks=[EarlyStopping(patience=2), *([checkpoint] if chief else [])])
        first = "fit returned"
    except kmp.collective.SettingsDifferError as err:
        first = str(err)
    history = model.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0,
                        callbacks=[EarlyStopping(patience=2), checkpoint])
    return first, history.history["loss"]


def test_a_chief_only_checkpoint_raises_on_every_worker_then_fit_trains(tmp_path):
    (first, losses_0), (second, losses_1) = kmp.launch(
        chief_only_checkpoint_then_the_same_everywhere, args=(str(tmp_path),), num_workers=2,
        timeout=200)
    prefix = "model.fit was given different kmp callbacks on different workers: here "
    assert first.startswith(prefix + "(worker 0) ['EarlyStopping', 'ModelCheckpoint']"), first
    assert second.startswith(prefix + "(worker 1) ['EarlyStopping']"), second
    assert "on worker(s) 1" in first and "on worker(s) 1" in second
    assert losses_0 == losses_1 and len(losses_0) == 2
    assert (tmp_path / "best.keras").is_file()


def test_kmp_callback_names_counts_each_instance_and_ignores_others():
    import keras

    from keras_mgpu_plugins.callbacks import EarlyStopping, StallWatchdog

    given = [StallWatchdog(timeout=5), keras.callbacks.TerminateOnNaN(), EarlyStopping(),
             EarlyStopping(monitor="val_loss")]
    assert _same_callbacks.kmp_callback_names(given) == ("EarlyStopping", "EarlyStopping",
                                                        "StallWatchdog")
    assert _same_callbacks.kmp_callback_names([]) == ()


def test_fit_outside_a_multi_worker_strategy_runs_no_check(monkeypatch):
    """install() wraps keras.Model.fit once; in one process fit does not call the check."""
    import keras

    _same_callbacks.install()
    _same_callbacks.install()
    assert getattr(keras.Model.fit, "_kmp_same_callbacks", False)
    assert not getattr(keras.Model.fit.__wrapped__, "_kmp_same_callbacks", False)

    def fail(*args):
        raise AssertionError("checked in one process")

    monkeypatch.setattr(_same_callbacks, "check", fail)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0, epochs=2)
    assert len(history.history["loss"]) == 2


def arrays_of_different_lengths():
    import keras

    @kmp.parallelize
    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    model = build()
    rows = 64 if kmp.topology().is_chief else 48  # 4 steps of 16 rows here, 3 there
    x = np.ones((rows, 4), "float32")
    try:
        model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
    except kmp.collective.SettingsDifferError as err:
        return str(err)
    return "fit returned"


def test_different_step_counts_raise_on_every_worker_naming_both_counts():
    """Without the check worker 0 waits forever in its 4th step (the run times out)."""
    messages = kmp.launch(arrays_of_different_lengths, num_workers=2, timeout=150)
    for index, message in enumerate(messages):
        assert message.startswith(
            "model.fit would run a different number of steps per epoch on different workers "
            f"(worker 0: 4, worker 1: 3; this is worker {index})."), message
        assert "steps_per_epoch" in message
