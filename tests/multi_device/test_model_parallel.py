"""strategy="model_parallel" in one process, over the 2 logical CPU devices of conftest.py."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.backends.tensorflow.model_parallel.pipeline import TRACED

D0, D1 = "/device:CPU:0", "/device:CPU:1"
SEEN: list[tuple[str, str]] = []


class Probe(keras.layers.Layer):
    """Records the device scope in effect inside its own call (when traced or run)."""

    def call(self, x):
        SEEN.append((self.name, tf.identity(x).device))
        return x


def mlp(optimizer="sgd", probes=False, name="mlp"):
    keras.utils.set_random_seed(7)
    inp = keras.Input((6,))
    h = inp
    for i in range(4):
        h = keras.layers.Dense(8, activation="tanh", name=f"dense_{i}")(h)
        if probes:
            h = Probe(name=f"probe_{i}")(h)
    model = keras.Model(inp, keras.layers.Dense(1, name="head")(h), name=name)
    opt = keras.optimizers.SGD(0.05) if optimizer == "sgd" else keras.optimizers.Adam(0.01)
    model.compile(optimizer=opt, loss="mse")
    return model


def data(n=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, np.tanh(x @ rng.normal(size=(6, 1))).astype("float32")


def short(device):
    return tf.DeviceSpec.from_string(device).to_string().split("device:")[-1]


def test_automatic_stages_hold_in_the_traced_train_step():
    model = kmp.parallelize(strategy="model_parallel")(mlp)(optimizer="adam", probes=True)
    SEEN.clear()
    model.fit(*data(), batch_size=8, epochs=1, verbose=0)
    # inside each probe's call during the traced step: its stage's device
    assert set(SEEN) == {("probe_0", D0), ("probe_1", D0), ("probe_2", D1), ("probe_3", D1)}
    stage = {"dense_0": "CPU:0", "dense_1": "CPU:0", "dense_2": "CPU:1", "dense_3": "CPU:1",
             "head": "CPU:1"}
    graph = TRACED[model]
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
    assert len(matmuls) == 15  # 5 forward, 10 backward
    for op in matmuls:  # forward and backward ops of a layer on its device
        layer = next(name for name in stage if f"/{name}_" in op.name or f"/{name}/" in op.name)
        assert op.device.endswith(stage[layer]), (op.name, op.device)
    for v in model.weights:
        assert short(v.value.device) == stage[v.path.split("/")[0]], v.path
    SEEN.clear()
    tf.function(lambda x: model(x))(tf.ones((2, 6)))  # a tf.function of the model: placed too
    assert set(SEEN) == {("probe_0", D0), ("probe_1", D0), ("probe_2", D1), ("probe_3", D1)}
    slots = [v for v in model.optimizer.variables if len(v.shape)]
    assert len(slots) == 2 * len(model.trainable_weights)
    for v in slots:  # adam/dense_2_kernel_momentum beside dense_2/kernel
        # the optimizer's name is uniquified per process ("adam_3" after other tests)
        layer = next(name for name in stage
                     if v.path.startswith(f"{model.optimizer.name}/{name}_"))
        assert short(v.value.device) == stage[layer], v.path


@kmp.parallelize(strategy="model_parallel")
def branches():
    """A shared layer called under `tf.device("/cpu:1")`, then under `keras.device("cpu:0")`."""
    a, b = keras.Input((6,)), keras.Input((6,))
    shared, probe = keras.layers.Dense(4, name="shared"), Probe(name="shared_probe")
    with tf.device("/cpu:1"):
        ea = probe(shared(a))
    with keras.device("cpu:0"):
        eb = probe(shared(b))
    out = keras.layers.Dense(1, name="out")(keras.layers.concatenate([ea, eb]))
    model = keras.Model([a, b], out)
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_explicit_scopes_per_call_and_shared_layer_on_both_devices():
    model = branches()
    x, y = data()
    SEEN.clear()
    model.fit([x, x[::-1]], y, batch_size=8, verbose=0)
    assert sorted(set(SEEN)) == [("shared_probe", D0), ("shared_probe", D1)]
    report = kmp.placement_report(model)
    assert report.row(D1).layers[:2] == ("shared", "shared_probe")
    assert "shared#2" in report.row(D0).layers
    assert short(model.get_layer("shared").kernel.value.device) == "CPU:1"  # built there


def test_same_weights_as_unplaced_and_predict_placed():
    x, y = data()
    plain = mlp()
    placed = kmp.parallelize(strategy="model_parallel", devices=["/cpu:1", "/cpu:0"])(mlp)()
    placed.set_weights(plain.get_weights())
    # placement renames nothing: same Keras paths and same tf.Variable names
    assert [(v.path, v.value.name) for v in placed.weights] == [
        (v.path, v.value.name) for v in plain.weights]
    plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    placed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), placed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(plain.predict(x, verbose=0), placed.predict(x, verbose=0),
                               atol=1e-5)
    assert kmp.placement_report(placed).rows[0].device == D1  # the order given


def test_micro_batches_same_weights_as_full_batch_and_refuses_a_remainder():
    x, y = data()
    full = kmp.parallelize(strategy="model_parallel")(mlp)()
    piecewise = kmp.parallelize(strategy="model_parallel", micro_batches=4)(mlp)()
    piecewise.set_weights(full.get_weights())
    h1 = full.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    h4 = piecewise.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(full.get_weights(), piecewise.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(h1.history["loss"], h4.history["loss"], rtol=1e-5)
    # stage 0's forward pass of every piece depends on no op of stage 1: TensorFlow may run
    # stage 0 on piece j + 1 while stage 1 runs piece j
    graph = TRACED[piecewise]
    first_stage = [op for op in graph.get_operations() if op.type == "MatMul"
                   and op.device.endswith("CPU:0") and "gradients" not in op.name]
    assert len(first_stage) == 4 * 2  # 2 layers on stage 0, 4 pieces
    for op in first_stage:  # every ancestor, through data and control edges
        seen, todo = set(), [op]
        while todo:
            node = todo.pop()
            for source in [t.op for t in node.inputs] + list(node.control_inputs):
                if source.name not in seen:
                    seen.add(source.name)
                    todo.append(source)
                    assert not source.device.endswith("CPU:1"), (op.name, source.name)
        assert any(s.startswith("split") or "/split" in s for s in seen), op.name  # its piece
    report = kmp.placement_report(piecewise)
    assert report.micro_batches == 4 and report.bubble_fraction == pytest.approx(1 / 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="micro_batches=4 must divide"):
        piecewise.fit(x[:30], y[:30], batch_size=10, verbose=0)


def test_checkpoints_load_in_plain_keras_and_back(tmp_path):
    x, y = data()
    placed = kmp.parallelize(strategy="model_parallel")(mlp)(optimizer="adam")
    placed.fit(x, y, batch_size=8, verbose=0)
    placed.save(tmp_path / "placed.keras")
    placed.save_weights(tmp_path / "placed.weights.h5")
    plain = keras.models.load_model(tmp_path / "placed.keras")
    assert [v.path for v in plain.weights] == [v.path for v in placed.weights]
    for a, b in zip(plain.get_weights(), placed.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)

    def slots(model):  # Adam's state by path without the optimizer's (uniquified) name
        return {v.path.split("/", 1)[1]: v.numpy() for v in model.optimizer.variables}

    assert len(slots(placed)) == 2 + 2 * len(placed.trainable_weights)
    assert slots(plain).keys() == slots(placed).keys()  # e.g. "head_kernel_momentum"
    for path, value in slots(placed).items():
        np.testing.assert_array_equal(slots(plain)[path], value, err_msg=path)
    plain.fit(x, y, batch_size=8, verbose=0)
    plain.save_weights(tmp_path / "plain.weights.h5")
    again = kmp.parallelize(strategy="model_parallel")(mlp)(optimizer="adam")
    again.optimizer.build(again.trainable_variables)  # so its slots load too, as in Keras
    again.load_weights(tmp_path / "plain.weights.h5")
    for a, b in zip(plain.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for path, value in slots(plain).items():
        np.testing.assert_array_equal(slots(again)[path], value, err_msg=path)
    assert short(again.get_layer("head").kernel.value.device) == "CPU:1"  # still placed
    for v in again.optimizer.variables:  # the loaded slots beside their variable
        if len(v.shape):
            layer = v.path.split("/")[1].rsplit("_", 2)[0]
            assert v.value.device == again.get_layer(layer).kernel.value.device, v.path


def test_model_checkpoint_and_early_stopping(tmp_path):
    x, y = data()
    model = kmp.parallelize(strategy="model_parallel")(mlp)()
    path = tmp_path / "best.keras"
    history = model.fit(x, y, batch_size=8, epochs=20, verbose=0, validation_data=(x, y * 0),
                        callbacks=[keras.callbacks.ModelCheckpoint(path, save_best_only=True),
                                   keras.callbacks.EarlyStopping(patience=1)])
    assert len(history.history["loss"]) < 20  # val_loss on zero targets stops improving
    best = keras.models.load_model(path)
    assert best.evaluate(x, y * 0, verbose=0) == pytest.approx(min(history.history["val_loss"]),
                                                                rel=1e-5)


def test_report_table_and_print_once_on_first_verbose_fit(capsys):
    model = kmp.parallelize(strategy="model_parallel")(mlp)(optimizer="adam")
    report = kmp.placement_report(model, batch_size=8)
    assert [r.device for r in report.rows] == [D0, D1]
    assert report.rows[0].layers == ("dense_0", "dense_1")
    assert report.rows[0].parameter_bytes == (6 * 8 + 8 + 8 * 8 + 8) * 4
    assert report.rows[0].optimizer_bytes == 2 * report.rows[0].parameter_bytes  # estimated
    assert report.rows[1].transfer_bytes == 8 * 8 * 4  # dense_1's output, batch 8
    assert report.rows[0].activation_bytes == 2 * 8 * 8 * 4
    assert not report.optimizer_measured and "(est.)" in str(report)
    table = str(report).splitlines()
    assert table[0] == "Placement (2 stages, batch 8, micro_batches 1, expected bubble 50%)"
    assert table[1].split() == ["device", "layers", "params", "optimizer", "activations", "in",
                                "from", "others"]
    # 128 parameters (512 B), Adam's 2 slots estimated, 2 outputs of 8 x 8, nothing in
    assert table[2].split() == [D0, "dense_0,", "dense_1", "512", "B", "1.0", "KiB", "(est.)",
                                "512", "B", "0", "B"]
    assert table[3].startswith(D1) and table[3].split()[-2:] == ["256", "B"]
    model.fit(*data(), batch_size=8, verbose=0)
    assert "Placement" not in capsys.readouterr().out
    model.fit(*data(), batch_size=8, verbose=2)
    model.fit(*data(), batch_size=8, verbose=2)
    out = capsys.readouterr().out
    assert out.count("Placement (2 stages") == 1 and "/device:CPU:1" in out
    assert "Placement (2 stages, batch 8," in out  # estimated for the fit's batch size
    measured = kmp.placement_report(model)
    assert measured.optimizer_measured
    assert measured.rows[1].optimizer_bytes == 2 * measured.rows[1].parameter_bytes
    with pytest.raises(ValueError, match="not placed"):
        kmp.placement_report(mlp())


def test_bad_input():
    placed = kmp.parallelize(strategy="model_parallel", devices=["/gpu:3"])(mlp)
    with pytest.raises(ValueError, match=r"device '/gpu:3' does not exist.*CPU:1"):
        placed()

    @kmp.parallelize(strategy="model_parallel")
    def scoped():
        inp = keras.Input((2,))
        with tf.device("/cpu:5"):
            out = keras.layers.Dense(1, name="scoped_dense")(inp)
        return keras.Model(inp, out)

    with pytest.raises(ValueError, match=r"around 'scoped_dense': device '.*CPU:5' does not exist"):
        scoped()

    def one_layer():
        inp = keras.Input((2,))
        return keras.Model(inp, keras.layers.Dense(1)(inp))

    with pytest.raises(ValueError, match="More stages than layers: 2 devices for 1 layer"):
        kmp.parallelize(strategy="model_parallel")(one_layer)()
    with pytest.raises(ValueError, match=r"pattern 'decoder\*' matches no layer.*dense_0"):
        kmp.parallelize(strategy="model_parallel",
                        devices={"dense_*": "/cpu:0", "decoder*": "/cpu:1"})(mlp)()
    with pytest.raises(ValueError, match="Sequential.*keras.Input"):
        kmp.parallelize(strategy="model_parallel")(
            lambda: keras.Sequential([keras.layers.Dense(2), keras.layers.Dense(1)]))()
    with pytest.raises(ValueError, match="sync_batchnorm applies to data-parallel.*sync_batchnorm=True"):
        kmp.parallelize(strategy="model_parallel", sync_batchnorm=True)(mlp)
    outside = mlp()
    with pytest.raises(ValueError, match="not called inside it"):
        kmp.parallelize(strategy="model_parallel")(lambda: outside)()
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="micro_batches must be a positive integer"):
            kmp.parallelize(strategy="model_parallel", micro_batches=bad)
    with pytest.raises(ValueError, match="micro_batches only applies"):
        kmp.parallelize(strategy="mirrored", micro_batches=2)


def test_several_workers_refused(monkeypatch):
    import json

    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker",
                                                                        "index": 0}}))
    with pytest.raises(ValueError, match="2 workers.*strategy=.hybrid."):
        kmp.parallelize(strategy="model_parallel")


class TwoTower(keras.Model):
    """Subclassed: its layers by name, and a tf.device of its own inside call."""

    def __init__(self):
        super().__init__()
        self.encoder_a = keras.layers.Dense(8, activation="tanh", name="encoder_a")
        self.probe_a = Probe(name="probe_a")
        self.encoder_b = keras.layers.Dense(8, activation="tanh", name="encoder_b")
        self.probe_b = Probe(name="probe_b")
        self.head = keras.layers.Dense(1, name="head")
        self.own = Probe(name="own")

    def call(self, x):
        a = self.probe_a(self.encoder_a(x))
        b = self.probe_b(self.encoder_b(x))
        with tf.device("/cpu:1"):  # the user's own scope keeps working
            merged = self.own(a + b)
        return self.head(merged)


def two_tower():
    keras.utils.set_random_seed(3)
    model = TwoTower()
    model(np.zeros((1, 6), "float32"))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def test_subclassed_placed_by_layer_name_patterns():
    x, y = data()
    plain = two_tower()
    placed = kmp.parallelize(strategy="model_parallel",
                             devices={"encoder_a": "/cpu:1", "*_b": "/cpu:0", "head": "/cpu:0"}
                             )(two_tower)()
    placed.set_weights(plain.get_weights())
    assert short(placed.encoder_a.kernel.value.device) == "CPU:1"
    assert short(placed.encoder_b.kernel.value.device) == "CPU:0"
    SEEN.clear()
    placed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    # probe_a matches no pattern: it runs where its caller's scope is (none: TF's choice)
    seen = dict(SEEN)
    assert seen["probe_b"] == D0 and seen["own"] == D1
    plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), placed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    report = kmp.placement_report(placed)
    assert {r.device: r.layers for r in report.rows} == {
        D1: ("encoder_a",), D0: ("encoder_b", "probe_b", "head")}
    with pytest.raises(ValueError, match="subclassed model. Pass devices as a mapping"):
        kmp.parallelize(strategy="model_parallel")(two_tower)()


def test_kmp_callbacks_and_a_compile_after_the_factory(tmp_path):
    x, y = data()

    model = kmp.parallelize(strategy="model_parallel")(mlp)()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=True)
    assert model.jit_compile is False  # XLA would put the whole step on one device
    csv = tmp_path / "metrics.csv"
    callbacks = [
        kmp.callbacks.ModelCheckpoint(str(tmp_path / "m-{epoch}.keras")),
        kmp.callbacks.EarlyStopping(monitor="loss", patience=5),
        kmp.callbacks.BackupAndRestore(str(tmp_path / "backup")),
        kmp.callbacks.DeviceMetricsLogger(csv_path=str(csv), progbar="all", sample_interval=None),
    ]
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
    for v in model.optimizer.variables:  # the new optimizer's slots beside their variable
        if len(v.shape):
            layer = v.path.split("/")[1].rsplit("_", 2)[0]
            assert v.value.device == model.get_layer(layer).kernel.value.device, v.path
    saved = keras.models.load_model(tmp_path / "m-2.keras")
    for a, b in zip(saved.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(csv.read_text().splitlines()) == 3  # header and one row per epoch


def test_batch_normalization_with_micro_batches_uses_each_piece():
    """As documented: each piece is normalised by its own statistics, moving stats updated M times."""

    def bn_model():
        inp = keras.Input((6,))
        h = keras.layers.BatchNormalization(momentum=0.5, name="bn")(inp)
        model = keras.Model(inp, keras.layers.Dense(1, name="out")(h))
        model.compile(optimizer="sgd", loss="mse")
        return model

    x, y = data(8)
    model = kmp.parallelize(strategy="model_parallel", micro_batches=2)(bn_model)()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    once = 0.5 * 0 + 0.5 * x[:4].mean(axis=0)
    np.testing.assert_allclose(model.get_layer("bn").moving_mean.numpy(),
                               0.5 * once + 0.5 * x[4:].mean(axis=0), atol=1e-5)


def test_functional_patterns_and_calls_that_follow_their_input():
    model = kmp.parallelize(strategy="model_parallel",
                            devices={"dense_0": "/cpu:0", "dense_2*": "cpu:1"})(mlp)(probes=True)
    report = kmp.placement_report(model)
    assert {r.device: r.layers for r in report.rows} == {
        D0: ("dense_0", "probe_0", "dense_1", "probe_1"),
        D1: ("dense_2", "probe_2", "dense_3", "probe_3", "head")}
    SEEN.clear()
    model.fit(*data(), batch_size=8, verbose=0)
    assert dict(SEEN)["probe_1"] == D0 and dict(SEEN)["probe_2"] == D1


def test_stages_balance_memory_not_layer_counts():
    def lopsided():
        inp = keras.Input((64,))
        h = keras.layers.Dense(256, name="big")(inp)  # 16.6k parameters: most of the model
        for i in range(3):
            h = keras.layers.Dense(4, name=f"small_{i}")(h)
        model = keras.Model(inp, h)
        model.compile(optimizer="adam", loss="mse")
        return model

    report = kmp.placement_report(kmp.parallelize(strategy="model_parallel")(lopsided)())
    assert [r.layers for r in report.rows] == [("big",), ("small_0", "small_1", "small_2")]
    assert report.rows[0].parameter_bytes == (64 * 256 + 256) * 4


def test_clone_model_of_a_placed_model_warns_that_the_clone_is_unplaced():
    from keras_mgpu_plugins.backends.tensorflow.model_parallel.factory import (
        PlacementNotClonedWarning,
    )
    from keras_mgpu_plugins.model_parallel import plans

    placed = kmp.parallelize(strategy="model_parallel", devices=["/cpu:1", "/cpu:0"])(mlp)()
    with pytest.warns(PlacementNotClonedWarning,
                      match=r"clone_model\('mlp'\) returns an unplaced model.*call the "
                            r"decorated factory again"):
        clone = keras.models.clone_model(placed)
    assert plans.of(clone) is None
    with pytest.raises(ValueError, match="placement_report takes a model built by"):
        kmp.placement_report(clone)
    import warnings

    with warnings.catch_warnings():  # an unplaced model clones without a word
        warnings.simplefilter("error")
        keras.models.clone_model(mlp())
