"""strategy="model_parallel": placement in every way the graph runs, a resumed fit, and a
model with its own train_step (over the 2 logical CPU devices of conftest.py)."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mgpu_plugins as kmp
from tests.multi_device.test_model_parallel import (
    D0,
    D1,
    SEEN,
    Probe,
    branches,
    data,
    mlp,
    short,
    two_tower,
)


def test_explicit_scopes_hold_in_evaluate_predict_and_a_tf_function():
    model = branches()
    x, y = data(16)
    runs = {
        "evaluate": lambda: model.evaluate([x, x], y, batch_size=8, verbose=0),
        "predict": lambda: model.predict([x, x], batch_size=8, verbose=0),
        "tf.function": lambda: tf.function(lambda a, b: model([a, b]))(x, x),
    }
    for what, run in runs.items():
        SEEN.clear()
        run()
        # the shared layer's two calls: one on each device, as the scopes said
        assert sorted(set(SEEN)) == [("shared_probe", D0), ("shared_probe", D1)], what


def test_report_counts_a_shared_layer_read_from_another_device_as_crossing():
    report = kmp.placement_report(branches(), batch_size=8)
    away, home = report.row(D0), report.row(D1)
    assert away.layers == ("shared#2", "shared_probe#2") and away.parameter_bytes == 0
    assert away.transfer_bytes == (6 * 4 + 4) * 4  # shared's kernel and bias, held on CPU:1
    assert home.layers[:2] == ("shared", "shared_probe") and home.layers[3] == "out"
    assert home.layers[2].startswith("concatenate")  # its name is uniquified per process
    assert home.parameter_bytes == (6 * 4 + 4 + 8 + 1) * 4
    assert home.transfer_bytes == 8 * 4 * 4  # the second branch's output, batch 8


class Interrupt(keras.callbacks.Callback):
    """Raises at the end of epoch `epoch` (0-based), as a crash would."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("crash")


def test_backup_and_restore_resumes_a_placed_model_exactly(tmp_path):
    x, y = data()
    placed = kmp.parallelize(strategy="model_parallel")(mlp)
    straight = placed(optimizer="adam")
    straight.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    crashed = placed(optimizer="adam")
    with pytest.raises(RuntimeError, match="crash"):
        crashed.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                    callbacks=[kmp.callbacks.BackupAndRestore(str(tmp_path)), Interrupt(1)])
    resumed = placed(optimizer="adam")
    history = resumed.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                          callbacks=[kmp.callbacks.BackupAndRestore(str(tmp_path))])
    assert len(history.history["loss"]) == 1  # epochs 0 and 1 came from the backup
    for a, b in zip(straight.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # Adam's slots restored too, or this differs
    for v in resumed.optimizer.variables:  # restored slots beside their variable
        if len(v.shape):
            layer = v.path.split("/")[1].rsplit("_", 2)[0]
            assert v.value.device == resumed.get_layer(layer).kernel.value.device, v.path
    assert short(resumed.get_layer("head").kernel.value.device) == "CPU:1"


class OwnStep(keras.Model):
    """A functional model whose class overrides train_step (it counts its traces)."""

    traced = 0

    def train_step(self, data):
        OwnStep.traced += 1
        return super().train_step(data)


def own_step(micro_batches=None):
    def build():
        keras.utils.set_random_seed(5)
        inp = keras.Input((6,))
        h = keras.layers.Dense(8, activation="tanh", name="first")(inp)
        h = Probe(name="own_probe")(h)
        model = OwnStep(inp, keras.layers.Dense(1, name="last")(h))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    if micro_batches is None:
        return build
    return kmp.parallelize(strategy="model_parallel", micro_batches=micro_batches)(build)


def test_a_model_with_its_own_train_step_keeps_it(caplog):
    x, y = data()
    plain = own_step()()
    with caplog.at_level(logging.WARNING, logger="keras_mgpu_plugins"):
        placed = kmp.parallelize(strategy="model_parallel")(own_step())()
    assert "OwnStep overrides train_step; it is kept" in caplog.text
    OwnStep.traced = 0
    SEEN.clear()
    placed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert OwnStep.traced >= 1  # the user's step ran, not replaced by kmp's
    report = {r.device: r.layers for r in kmp.placement_report(placed).rows}
    assert report == {D0: ("first",), D1: ("own_probe", "last")}
    assert dict(SEEN)["own_probe"] == D1  # its forward pass placed
    assert short(placed.get_layer("last").kernel.value.device) == "CPU:1"
    plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), placed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match=r"micro_batches=2 needs kmp's placed train step.*"
                                         r"OwnStep, which overrides train_step"):
        own_step(micro_batches=2)()


def test_unscoped_calls_build_their_variables_on_the_staging_device():
    from keras_mgpu_plugins.backends.tensorflow.model_parallel import placement
    from keras_mgpu_plugins.backends.tensorflow.patches import functional_graph as private

    assert placement.staging_device() is None  # no GPU here: TensorFlow's default device
    with placement.recording(staging="/device:CPU:1") as scopes:
        inp = keras.Input((6,))
        staged = keras.layers.Dense(4, name="staged")(inp)
        with tf.device("/cpu:0"):
            scoped = keras.layers.Dense(2, name="scoped")(staged)
        after = keras.layers.Dense(1, name="after")(scoped)
    devices = {name: short(keras.Model(inp, after).get_layer(name).kernel.value.device)
               for name in ("staged", "scoped", "after")}
    assert devices == {"staged": "CPU:1", "scoped": "CPU:0", "after": "CPU:1"}
    recorded = [scopes[id(private.node_of(t))] for t in (staged, scoped, after)]
    assert recorded[0] == recorded[2] == "" and short(recorded[1]) == "CPU:0"  # as called


def test_variables_staged_away_from_the_first_stage_end_on_their_stage(monkeypatch):
    """As on a machine with GPUs: built on the host (here CPU:1), then moved to their stage."""
    from keras_mgpu_plugins.backends.tensorflow.model_parallel import placement

    x, y = data()
    plain = mlp()
    monkeypatch.setattr(placement, "staging_device", lambda: "/device:CPU:1")
    placed = kmp.parallelize(strategy="model_parallel")(mlp)()
    assert {v.path: short(v.value.device) for v in placed.weights} == {
        f"{layer}/{kind}": "CPU:0" if layer in ("dense_0", "dense_1") else "CPU:1"
        for layer in ("dense_0", "dense_1", "dense_2", "dense_3", "head")
        for kind in ("kernel", "bias")}
    assert [(v.path, v.value.name) for v in placed.weights] == [
        (v.path, v.value.name) for v in plain.weights]
    for a, b in zip(plain.get_weights(), placed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # same seeded initial values
    plain.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    placed.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), placed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_staged_variables_that_no_pattern_places_go_to_the_first_device(monkeypatch):
    from keras_mgpu_plugins.backends.tensorflow.model_parallel import placement

    monkeypatch.setattr(placement, "staging_device", lambda: "/device:CPU:1")
    placed = kmp.parallelize(strategy="model_parallel",
                             devices={"encoder_a": "/cpu:1", "*_b": "/cpu:1"})(two_tower)()
    assert short(placed.encoder_a.kernel.value.device) == "CPU:1"
    assert short(placed.encoder_b.kernel.value.device) == "CPU:1"
    assert short(placed.head.kernel.value.device) == "CPU:0"  # unmatched: not left staged
    placed.fit(*data(), batch_size=8, verbose=0)


def test_balance_weighs_parameters_optimizer_slots_and_activations():
    from keras_mgpu_plugins.backends.tensorflow.model_parallel.placement import Call
    from keras_mgpu_plugins.backends.tensorflow.patches import functional_graph as private
    from keras_mgpu_plugins.model_parallel import costs

    inp = keras.Input((10,), batch_size=4)
    shared = keras.layers.Dense(3, name="weighed")
    first, second = shared(inp), shared(keras.layers.Dense(10, name="other")(inp))
    model = keras.Model(inp, [first, second])
    for optimizer, slots in (("adam", 2), ("sgd", 0), ("rmsprop", 1)):
        model.compile(optimizer=optimizer, loss="mse")
        estimate = costs.Estimator(model)
        assert (estimate.slots, estimate.batch) == (slots, 4)
        calls = [Call(private.node_of(t), shared, "", "", "auto") for t in (first, second)]
        # its 33 parameters and their slots once, then each call's 4 x 3 output (float32)
        assert estimate.call_bytes(calls[0]) == 33 * 4 * (1 + slots) + 4 * 3 * 4
        assert estimate.call_bytes(calls[1]) == 4 * 3 * 4
