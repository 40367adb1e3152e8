"""WeightSyncVerifier over the 2 logical CPU devices of tests/conftest.py (2 replicas).

Drift is planted by writing one replica's copy of a variable directly, the
way a faulty device or a forgotten per-replica update would leave it.
"""

from __future__ import annotations

import gc
import logging
import os
import weakref

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import events
from keras_mgpu_plugins.callbacks.weight_sync_verifier import WeightSyncVerifier

LOGGER = "keras_mgpu_plugins.callbacks.weight_sync_verifier"


def build_model(batch_norm=True, optimizer="adam", compile=True):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((6,)), keras.layers.Dense(8, activation="relu")]
    if batch_norm:
        layers += [keras.layers.BatchNormalization(), keras.layers.Dropout(0.2)]
    model = keras.Sequential([*layers, keras.layers.Dense(1)])
    if compile:
        model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    return model


def mirrored(**kwargs):
    return kmp.parallelize(strategy="mirrored")(build_model)(**kwargs)


def data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x @ rng.normal(size=(6, 1))).astype("float32")


def copies(model, variable):
    return model.distribute_strategy.experimental_local_results(variable.value)


def nudge(model, variable, replica=1, by=1e-3):
    copy = copies(model, variable)[replica]
    copy.assign(copy.numpy() + by)


def flip_last_bit(model, variable, replica=1, index=0):
    copy = copies(model, variable)[replica]
    value = copy.numpy()
    value.reshape(-1).view(np.uint32)[index] ^= np.uint32(1)
    copy.assign(value)


def fit(model, callbacks, epochs=1, **kwargs):
    x, y = data()
    return model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=callbacks, **kwargs)


class AtEpochEnd(keras.callbacks.Callback):
    def __init__(self, epoch, action):
        super().__init__()
        self.epoch, self.action = epoch, action

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            self.action(self.model)


def test_no_false_alarm_over_several_epochs_with_batch_norm_dropout_adam():
    model = mirrored()
    verifier = WeightSyncVerifier()  # on_mismatch="raise"
    history = fit(model, [verifier], epochs=3)
    assert len(history.history["loss"]) == 3
    assert [r.where for r in verifier.reports] == [
        "train begin", "end of epoch 1", "end of epoch 2", "end of epoch 3"]
    assert all(r.mismatches == () for r in verifier.reports)
    # the replicas' trainable and optimizer state are bit-identical, as checked
    for var in model.trainable_variables + model.optimizer.variables:
        a, b = (c.numpy() for c in copies(model, var))
        assert np.array_equal(a, b), var.path
    # BatchNormalization's statistics drift apart, and are reported apart
    unsynced = {u.path: u for u in verifier.reports[-1].unsynced}
    bn = model.layers[1]
    assert set(unsynced) == {bn.moving_mean.path, bn.moving_variance.path}
    for var in (bn.moving_mean, bn.moving_variance):
        a, b = (c.numpy() for c in copies(model, var))
        assert unsynced[var.path].copies == ((0, 1),)
        assert unsynced[var.path].max_abs_diff == pytest.approx(np.max(np.abs(a - b)), abs=1e-7)
        assert unsynced[var.path].max_abs_diff > 1e-4


def test_keras_batch_norm_statistics_drift_after_one_step():
    """Keras creates moving statistics with aggregation "none": each replica updates its own."""
    model = mirrored()
    x, y = data(32)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # one step, 16 rows per replica
    bn = model.layers[1]
    drift = {}
    for var in (bn.moving_mean, bn.moving_variance):
        assert var.value.aggregation.name == "NONE" and not var.trainable
        a, b = (c.numpy() for c in copies(model, var))
        drift[var.name] = float(np.max(np.abs(a - b)))
        np.testing.assert_array_equal(var.numpy(), a)  # what get_weights() and save() see
    assert 1e-4 < drift["moving_mean"] < 1e-1, drift  # measured here: 4.0e-3 (mean), 4.3e-3 (variance)
    assert 1e-4 < drift["moving_variance"] < 1e-1, drift


def test_sync_stats_averages_statistics_over_replicas():
    model = mirrored()
    bn = model.layers[1]
    planted = {}
    for var in (bn.moving_mean, bn.moving_variance):
        a, b = copies(model, var)
        a.assign(np.full(8, 1.0, "float32"))
        b.assign(np.arange(8, dtype="float32"))
        planted[var.path] = (np.full(8, 1.0) + np.arange(8)) / 2
    verifier = WeightSyncVerifier(sync_stats=True)
    fit(model, [verifier], epochs=1, initial_epoch=1)  # no step: only train begin and end
    assert [r.where for r in verifier.reports] == ["train begin", "train end"]
    assert {u.path for u in verifier.reports[0].unsynced} == set(planted)
    assert verifier.reports[0].mismatches == ()
    for var in (bn.moving_mean, bn.moving_variance):
        for copy in copies(model, var):
            np.testing.assert_array_equal(copy.numpy(), planted[var.path].astype("float32"))
    weights = dict(zip([v.path for v in model.weights], model.get_weights(), strict=True))
    np.testing.assert_array_equal(weights[bn.moving_mean.path], planted[bn.moving_mean.path])


def test_sync_stats_after_training_leaves_every_replica_equal():
    model = mirrored()
    with pytest.warns(DeprecationWarning, match="every_n_epochs"):  # still honoured, one release
        verifier = WeightSyncVerifier(sync_stats=True, every_n_epochs=2)
    fit(model, [verifier], epochs=3)  # epoch 3 is not a check: train end syncs
    assert [r.where for r in verifier.reports] == ["train begin", "end of epoch 2", "train end"]
    assert all(r.mismatches == () for r in verifier.reports)
    assert verifier.reports[1].unsynced and verifier.reports[2].unsynced
    for var in model.variables:
        if var.synchronization != "on_read":
            a, b = (c.numpy() for c in copies(model, var))
            assert np.array_equal(a, b), var.path


@pytest.mark.parametrize("where", ["kernel", "optimizer"])
def test_planted_drift_raises_naming_variable_replica_and_difference(where):
    model = mirrored()
    fit(model, [])  # the optimizer has state to drift
    var = model.layers[0].kernel if where == "kernel" else model.optimizer.variables[2]
    nudge(model, var, replica=1, by=1e-3)
    with pytest.raises(kmp.WeightsOutOfSyncError, match="at train begin") as info:
        fit(model, [WeightSyncVerifier()])
    (record,) = info.value.mismatches
    assert record.path == var.path
    assert record.role == ("model" if where == "kernel" else "optimizer")
    assert record.copies == ((0, 1),)
    assert record.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert var.path in str(info.value) and "worker 0 replica 1" in str(info.value)


def test_one_flipped_bit_is_caught():
    model = mirrored()
    bias = model.layers[-1].bias
    copies(model, bias)[1].assign(np.float32([0.25]))
    copies(model, bias)[0].assign(np.float32([0.25]))
    flip_last_bit(model, bias, replica=1)
    with pytest.raises(kmp.WeightsOutOfSyncError) as info:
        fit(model, [WeightSyncVerifier()])
    (record,) = info.value.mismatches
    assert record.path == bias.path and record.copies == ((0, 1),)
    assert record.max_abs_diff == pytest.approx(np.spacing(np.float32(0.25)))  # 2.98e-08


def test_drift_during_training_raises_at_the_next_check():
    model = mirrored()
    kernel = model.layers[0].kernel
    planter = AtEpochEnd(1, lambda m: nudge(m, kernel))  # listed first: runs before the check
    verifier = WeightSyncVerifier(check_freq="epoch")
    with pytest.raises(kmp.WeightsOutOfSyncError, match="at end of epoch 2:"):
        fit(model, [planter, verifier], epochs=4)
    assert [r.where for r in verifier.reports] == ["train begin", "end of epoch 1", "end of epoch 2"]


@pytest.mark.parametrize("at_begin", [True, False])
def test_check_freq_in_batches_checks_at_those_steps(at_begin):
    model = mirrored()
    verifier = WeightSyncVerifier(check_freq=3, check_on_train_begin=at_begin)
    fit(model, [verifier], epochs=2)  # 4 steps per epoch
    assert [r.where for r in verifier.reports] == [
        "train begin"] * at_begin + ["epoch 1, step 3", "epoch 2, step 6"]


def test_warn_logs_and_goes_on(caplog):
    model = mirrored(batch_norm=False)
    nudge(model, model.layers[0].bias)
    verifier = WeightSyncVerifier(on_mismatch="warn")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        history = fit(model, [verifier], epochs=2)
    assert len(history.history["loss"]) == 2
    assert [len(r.mismatches) for r in verifier.reports] == [1, 1, 1]
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 3 and all(model.layers[0].bias.path in m for m in messages)


def test_resync_copies_the_chiefs_first_replica_and_goes_on(caplog):
    model = mirrored(batch_norm=False)
    kernel = model.layers[0].kernel
    chief_value = copies(model, kernel)[0].numpy()
    nudge(model, kernel, by=0.5)
    verifier = WeightSyncVerifier(on_mismatch="resync", check_freq="epoch")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fit(model, [verifier], epochs=1, initial_epoch=1)
    np.testing.assert_array_equal(copies(model, kernel)[1].numpy(), chief_value)
    assert "Resynchronised" in caplog.text
    history = fit(model, [verifier], epochs=2)
    assert len(history.history["loss"]) == 2
    assert all(r.mismatches == () for r in verifier.reports)


def test_model_outside_any_strategy_says_one_replica_once(caplog):
    model = build_model()
    verifier = WeightSyncVerifier(check_freq="epoch")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fit(model, [verifier], epochs=2)
        fit(model, [verifier], epochs=1)
    said = [r.getMessage() for r in caplog.records if "one replica" in r.getMessage()]
    assert len(said) == 1 and "with one worker, nothing to compare" in said[0]
    assert all(r.mismatches == () and r.unsynced == () for r in verifier.reports)


# --- sync_stats and checkpoints: order does not matter -----------------------------------


def statistics(model):
    bn = model.layers[1]
    return [bn.moving_mean, bn.moving_variance]


def replica_values(model):
    return [[c.numpy() for c in copies(model, var)] for var in statistics(model)]


def replica_average(values):
    """The mean over replicas as the verifier computes it: float64 sum, divided, cast back."""
    return (np.sum([v.astype(np.float64) for v in values], axis=0) / len(values)).astype(values[0].dtype)


def saved_statistics(path):
    plain = build_model(compile=False)
    plain.load_weights(path)
    return [var.numpy() for var in statistics(plain)]


class SaveProbe(keras.callbacks.Callback):
    """Listed first: sees each replica's statistics when a save begins (before any listener
    subscribed after it), and again at the very end of each epoch when listed last."""

    def __init__(self):
        super().__init__()
        self.at_save, self.at_epoch_end = [], []

    def on_train_begin(self, logs=None):
        events.subscribe(self.model, "before_save", self.seen)

    def seen(self, payload):
        payload = dict(payload)  # shared with the other listeners
        assert payload.pop("fit") == id(self.params)  # the fit this probe is part of
        self.at_save.append((payload, replica_values(self.model)))

    def on_epoch_end(self, epoch, logs=None):
        self.at_epoch_end.append(replica_values(self.model))

    def on_train_end(self, logs=None):
        events.unsubscribe(self.model, "before_save", self.seen)


def checkpoint_fit(directory, verifier_first, epochs=2, **checkpoint_kwargs):
    model = mirrored()
    probe, tail = SaveProbe(), SaveProbe()
    checkpoint = kmp.callbacks.ModelCheckpoint(str(directory / "{epoch}.weights.h5"),
                                               save_weights_only=True, **checkpoint_kwargs)
    verifier = WeightSyncVerifier(sync_stats=True)
    pair = [verifier, checkpoint] if verifier_first else [checkpoint, verifier]
    fit(model, [probe, *pair, tail], epochs=epochs)
    return model, probe, tail, verifier


def test_checkpoint_listed_first_holds_the_averaged_statistics(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        model, probe, tail, verifier = checkpoint_fit(tmp_path, verifier_first=False)
    assert [payload for payload, _ in probe.at_save] == [
        {"epoch": 0, "batch": None}, {"epoch": 1, "batch": None}]
    for epoch, (_, at_save) in enumerate(probe.at_save):
        saved = saved_statistics(tmp_path / f"{epoch + 1}.weights.h5")
        for values, in_file, after in zip(at_save, saved, tail.at_epoch_end[epoch], strict=True):
            assert not np.array_equal(values[0], values[1])  # the replicas had drifted apart
            np.testing.assert_array_equal(in_file, replica_average(values))  # to the bit
            for copy in after:  # and the model holds what was saved, on every replica
                np.testing.assert_array_equal(copy, in_file)
    # averaged before each save; the end-of-epoch checks then find every copy equal
    assert [r.where for r in verifier.reports] == [
        "train begin", "before save, end of epoch 1", "end of epoch 1",
        "before save, end of epoch 2", "end of epoch 2", "train end"]
    assert [len(r.unsynced) for r in verifier.reports] == [0, 2, 0, 2, 0, 0]
    assert all(r.mismatches == () for r in verifier.reports)
    assert "was saved before" not in caplog.text and "List WeightSyncVerifier" not in caplog.text
    weights = dict(zip([v.path for v in model.weights], model.get_weights(), strict=True))
    for var, in_file in zip(statistics(model), saved_statistics(tmp_path / "2.weights.h5"), strict=True):
        np.testing.assert_array_equal(weights[var.path], in_file)


def test_the_order_of_checkpoint_and_verifier_changes_no_saved_bit(tmp_path):
    first, second = tmp_path / "checkpoint_first", tmp_path / "verifier_first"
    *_, verifier_last = checkpoint_fit(first, verifier_first=False)
    _, probe, _, verifier = checkpoint_fit(second, verifier_first=True)
    for epoch in (1, 2):
        name = f"{epoch}.weights.h5"
        with_order = [saved_statistics(d / name) for d in (first, second)]
        for a, b in zip(*with_order, strict=True):
            np.testing.assert_array_equal(a, b)
    # listed first, the verifier averaged at its check: the save found nothing left to do
    assert [r.where for r in verifier.reports] == [
        "train begin", "end of epoch 1", "end of epoch 2", "train end"]
    for _, at_save in probe.at_save:
        for values in at_save:
            np.testing.assert_array_equal(values[0], values[1])
    assert len(verifier_last.reports) == 6


def test_batch_frequency_saves_hold_the_average_at_that_step(tmp_path):
    model = mirrored()
    probe = SaveProbe()
    checkpoint = kmp.callbacks.ModelCheckpoint(str(tmp_path / "{epoch}-{batch}.weights.h5"),
                                               save_weights_only=True, save_freq=2)
    verifier = WeightSyncVerifier(sync_stats=True)  # checks at epoch end only
    fit(model, [probe, checkpoint, verifier], epochs=1)  # 4 steps: saves after steps 2 and 4
    assert [payload for payload, _ in probe.at_save] == [
        {"epoch": 0, "batch": 1}, {"epoch": 0, "batch": 3}]
    for (_, at_save), name in zip(probe.at_save, ("1-2", "1-4"), strict=True):
        for values, in_file in zip(at_save, saved_statistics(tmp_path / f"{name}.weights.h5"),
                                   strict=True):
            assert not np.array_equal(values[0], values[1])
            np.testing.assert_array_equal(in_file, replica_average(values))
    assert [r.where for r in verifier.reports][1:3] == [
        "before save, epoch 1, batch 2", "before save, epoch 1, batch 4"]


def test_without_sync_stats_the_checkpoint_keeps_replica_zeros_statistics(tmp_path):
    model = mirrored()
    probe = SaveProbe()
    checkpoint = kmp.callbacks.ModelCheckpoint(str(tmp_path / "{epoch}.weights.h5"),
                                               save_weights_only=True)
    fit(model, [probe, checkpoint, WeightSyncVerifier()], epochs=1)
    ((_, at_save),) = probe.at_save
    for values, in_file in zip(at_save, saved_statistics(tmp_path / "1.weights.h5"), strict=True):
        assert not np.array_equal(values[0], values[1])
        np.testing.assert_array_equal(in_file, values[0])  # as Keras saves: replica 0's


def test_a_checkpoint_callback_without_before_save_is_told_to_come_after(caplog):
    class FakeCheckpoint(keras.callbacks.Callback):  # publishes "checkpoint_saved" only
        def on_epoch_end(self, epoch, logs=None):
            events.publish(self.model, "checkpoint_saved", {
                "path": "m.keras", "epoch": epoch, "batch": None, "is_best": True,
                "monitor": "loss", "value": 0.0})

    model = mirrored()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fit(model, [WeightSyncVerifier(sync_stats=True), FakeCheckpoint()], epochs=2)
    assert "was saved before" not in caplog.text
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fit(model, [FakeCheckpoint(), WeightSyncVerifier(sync_stats=True)], epochs=2)
    assert caplog.text.count("A checkpoint of epoch 1 was saved before") == 1
    assert 'does not publish the "before_save" event' in caplog.text


def test_a_verifier_left_subscribed_by_a_failed_fit_ignores_later_fits(tmp_path):
    model = mirrored()
    verifier = WeightSyncVerifier(sync_stats=True)
    stop = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        fit(model, [verifier, stop], epochs=1)  # on_train_end never unsubscribes
    before = list(verifier.reports)
    checkpoint = kmp.callbacks.ModelCheckpoint(str(tmp_path / "{epoch}.weights.h5"),
                                               save_weights_only=True)
    fit(model, [checkpoint], epochs=2)
    assert sorted(os.listdir(tmp_path)) == ["1.weights.h5", "2.weights.h5"]
    assert list(verifier.reports) == before  # no check, no averaging for another fit's saves


def test_a_failed_fit_leaves_no_listener_keeping_the_verifier_alive():
    model = mirrored()
    nudge(model, model.layers[0].kernel)
    verifier = WeightSyncVerifier(sync_stats=True)
    with pytest.raises(kmp.WeightsOutOfSyncError):
        fit(model, [verifier])  # raises at train begin: on_train_end never unsubscribes
    ref = weakref.ref(verifier)
    del verifier
    gc.collect()
    assert ref() is None
    events.publish(model, "before_save", {"epoch": 0, "batch": None})  # a dead listener: no-op


def test_never_creates_a_multi_worker_strategy_during_fit(monkeypatch):
    """The environment names 2 workers, the model trains alone under "mirrored": the verifier
    checks its replicas, and creates no multi-worker strategy mid-fit (it did, and failed)."""
    import json

    from keras_mgpu_plugins import strategy as strategies

    cluster = {"worker": ["localhost:1", "localhost:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    model = mirrored()
    verifier = WeightSyncVerifier()
    fit(model, [verifier])
    assert [r.where for r in verifier.reports] == ["train begin", "end of epoch 1"]
    assert all(r.mismatches == () for r in verifier.reports)
    assert not [key for key in strategies._strategies if key[0] == "multi_worker"]
