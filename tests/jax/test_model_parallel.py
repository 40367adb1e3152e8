"""`strategy="model_parallel"` and `"hybrid"` on JAX train, evaluate and predict as one device.

2 simulated CPU devices in this process (the root conftest) for "model_parallel", 2
processes of 2 devices each (`kmp.launch`) for "hybrid", against plain Keras on one
device: SGD and Adam, weights within 1e-5; the variables sharded as chosen (or as a
`layout_map` says), each device's bytes measured from the arrays' shards.
"""

from __future__ import annotations

import json
import warnings

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.backends.jax import models
from tests.jax import helpers
from tests.jax import model_parallel_job as job

pytestmark = [pytest.mark.timeout(300)]
TOLERANCE = 1e-5
OPTIMIZERS = {"sgd": False, "adam": True}
DEVICES = helpers.simulated_devices(2)



_REFERENCES: dict = {}


def reference(name: str, batch: int = job.BATCH) -> dict:
    """Plain Keras on one device (computed once per optimizer and batch size)."""
    if (name, batch) not in _REFERENCES:
        keras.distribution.set_distribution(None)
        model = job.build(OPTIMIZERS[name])
        with keras.device("cpu:0"):
            results = job.train(model, batch=batch)
        results["weights"] = model.get_weights()
        _REFERENCES[(name, batch)] = results
    return _REFERENCES[(name, batch)]


def assert_as_one_device(results: dict, expected: dict, weights: list) -> None:
    for index, (got, want) in enumerate(zip(weights, expected["weights"], strict=True)):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0, err_msg=f"weight {index}")
    history, wanted = json.loads(results["history"]), json.loads(expected["history"])
    assert history.keys() == wanted.keys()
    for key in wanted:
        np.testing.assert_allclose(history[key], wanted[key], atol=TOLERANCE, rtol=0, err_msg=key)
    np.testing.assert_allclose(results["evaluate"], expected["evaluate"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(results["predict"], expected["predict"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_model_parallel_trains_as_one_device(name, tmp_path):
    expected = reference(name)
    model = kmp.parallelize(job.build, strategy="model_parallel")(OPTIMIZERS[name])
    results = job.train(model, [kmp.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))])
    assert_as_one_device(results, expected, job.weights(model))
    keras.distribution.set_distribution(None)
    loaded = keras.saving.load_model(tmp_path / "m.keras")  # plain Keras, one device
    for got, want in zip(loaded.get_weights(), job.weights(model), strict=True):
        np.testing.assert_allclose(got, want, atol=0, rtol=0)
    shards = {v.path: [s.data.shape for s in v.value.addressable_shards] for v in model.weights}
    assert shards["hidden/kernel"] == [(96, 16), (96, 16)]  # output columns
    assert shards["table/embeddings"] == [(16, 16), (16, 16)]  # rows
    assert shards["narrow/kernel"] == [(32, 5), (32, 5)]  # 5 columns over 2: replicated
    assert shards["hidden/bias"] == [(32,), (32,)]  # small: replicated
    slots = [v for v in model.optimizer.variables if "hidden_kernel" in v.path]
    assert all([s.data.shape for s in v.value.addressable_shards] == [(96, 16)] * 2 for v in slots)


def test_batches_need_only_divide_over_the_batch_axis():
    """The batch axis has 1 device in one process: batch_size=5 (last batch 2) is fed whole."""
    expected = reference("sgd", batch=5)
    model = kmp.parallelize(job.build, strategy="model_parallel")()
    assert_as_one_device(job.train(model, batch=5), expected, job.weights(model))


def balanced(adam: bool = True):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,), dtype="int32")
    hidden = keras.layers.Flatten()(keras.layers.Embedding(256, 32, name="table")(inputs))
    hidden = keras.layers.Dense(64, activation="relu", name="wide")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(8, name="head")(hidden))
    model.compile(keras.optimizers.Adam(0.01) if adam else "sgd", "mse")
    return model


def test_each_device_holds_an_even_share_of_parameter_and_optimizer_bytes():
    model = kmp.parallelize(balanced, strategy="model_parallel")()
    x = np.random.default_rng(1).integers(0, 256, size=(16, 4)).astype("int32")
    model.fit(x, np.zeros((16, 8), "float32"), batch_size=8, epochs=1, verbose=0, shuffle=False)
    held: dict[str, int] = {}
    total = 0
    for variable in [*model.weights, *model.optimizer.variables]:
        if len(variable.shape) == 0:
            continue
        total += int(np.prod(variable.shape)) * 4
        for shard in variable.value.addressable_shards:
            held[str(shard.device)] = held.get(str(shard.device), 0) + int(shard.data.nbytes)
    even = total / 2
    assert len(held) == 2
    for device, size in held.items():
        assert abs(size - even) <= 0.10 * even, (device, size, even)
    report = kmp.placement_report(model)
    assert report.optimizer_measured
    assert sorted(r.parameter_bytes + r.optimizer_bytes for r in report.rows) == sorted(
        held.values())


def test_placement_report_lists_shards_and_layouts():
    model = kmp.parallelize(job.build, strategy="model_parallel")(True)
    report = kmp.placement_report(model)
    assert [r.device for r in report.rows] == ["cpu:0", "cpu:1"]
    assert not report.optimizer_measured  # before fit: estimated (Adam: 2 slots)
    first, second = report.rows
    assert "hidden/kernel[:, 0:16]" in first.layers and "hidden/kernel[:, 16:32]" in second.layers
    assert "table/embeddings[16:32, :]" in second.layers and "narrow/kernel" in first.layers
    assert first.parameter_bytes == second.parameter_bytes
    assert first.optimizer_bytes == 2 * first.parameter_bytes  # estimated: 2 slots each
    layouts = dict(report.layouts)
    assert layouts["hidden/kernel"].startswith("(None, 'model')")
    assert "does not divide" in layouts["narrow/kernel"] and "(size 5)" in layouts["narrow/kernel"]
    assert "Layouts" in str(report) and "Sharded over 2 devices" in str(report)


def user_map(**entries):
    layout_map = keras.distribution.LayoutMap(None)
    for key, axes in entries.items():
        layout_map[key.replace("__", "/")] = axes
    return layout_map


def test_layout_map_overrides_the_choice_and_trains_as_one_device():
    layout_map = user_map(hidden__kernel=("model", None), **{"table__.*": (None, "model")})
    model = kmp.parallelize(job.build, strategy="model_parallel", layout_map=layout_map)()
    shards = {v.path: [s.data.shape for s in v.value.addressable_shards] for v in model.weights}
    assert shards["hidden/kernel"] == [(48, 32)] * 2
    assert shards["table/embeddings"] == [(32, 8)] * 2
    assert shards["out/kernel"] == [(5, 2)] * 2  # not in the map: replicated
    assert_as_one_device(job.train(model), reference("sgd"), job.weights(model))


def guide_model(optimizer="adam"):
    """keras.io's distribution guide's model (layers "d1", "d2"), small and functional (in a
    Sequential its variables' paths start with the model's name: the guide's keys then
    match nothing, in Keras as here)."""
    keras.utils.set_random_seed(5)
    inputs = keras.layers.Input(shape=(12,))
    hidden = keras.layers.Dense(8, activation="relu", name="d1")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="d2")(hidden))
    model.compile(loss="mse", optimizer=optimizer)
    return model


def guide_map():
    """The guide's own LayoutMap: its mesh ("data", "model"), a kernel and a bias sharded, and
    a layer *output* laid out ("d2/output")."""
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((1, 2), ["data", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["d1/kernel"] = (None, "model")
    layout_map["d1/bias"] = keras.distribution.TensorLayout(("model",), mesh)
    layout_map["d2/output"] = ("data", None)
    return layout_map


def test_the_distribution_guides_layout_map_is_taken_as_keras_takes_it():
    x = np.random.default_rng(1).normal(size=(21, 12)).astype("float32")
    y = np.random.default_rng(2).uniform(size=(21, 3)).astype("float32")
    keras.distribution.set_distribution(None)
    expected = guide_model()
    expected.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every key is used: no warning
        model = kmp.parallelize(guide_model, strategy="model_parallel", layout_map=guide_map())()
    distribution = models.distribution_of(model)
    assert "d2/output" in distribution.matched and distribution.batch_dim_name == "data"
    shards = {v.path: [s.data.shape for s in v.value.addressable_shards] for v in model.weights}
    assert shards["d1/kernel"] == [(12, 4)] * 2 and shards["d1/bias"] == [(4,)] * 2
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)  # a last batch of 5
    for got, want in zip(job.weights(model), expected.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(model.predict(x[:7], verbose=0), expected.predict(x[:7], verbose=0),
                               atol=TOLERANCE, rtol=0)


def test_a_key_that_matches_nothing_warns_once_naming_what_it_could_mean():
    layout_map = user_map(hiden__kernel=(None, "model"), **{"hidden__kernel": (None, "model")})
    with pytest.warns(UserWarning) as seen:
        kmp.parallelize(job.build, strategy="model_parallel", layout_map=layout_map)()
    messages = [str(w.message) for w in seen if "hiden/kernel" in str(w.message)]
    assert len(messages) == 1, messages
    assert "matches none of the model's variables and no layer output" in messages[0]
    assert "Did you mean 'hidden/kernel'" in messages[0] and "/output" in messages[0]


def test_a_large_variable_the_map_leaves_replicated_is_named_and_reported(monkeypatch):
    from keras_mgpu_plugins.backends.jax import placement

    monkeypatch.setattr(placement, "LARGE_BYTES", 1024)  # the tests' model is tiny
    layout_map = user_map(hidden__kernel=(None, "model"))  # the embedding table: in no key
    with pytest.warns(UserWarning, match="table/embeddings"):
        model = kmp.parallelize(job.build, strategy="model_parallel", layout_map=layout_map)()
    layouts = dict(kmp.placement_report(model).layouts)
    assert "LARGE" in layouts["table/embeddings"] and "no layout_map key" in layouts[
        "table/embeddings"]
    assert "LARGE" not in layouts["hidden/kernel"]


@pytest.mark.parametrize("entries, words", [
    ({"narrow__kernel": (None, "model")},
     ["'narrow/kernel'", "(32, 5)", "dimension 1 (size 5)", "'model'", "2 devices"]),
    ({"out__kernel": ("model",)}, ["'out/kernel'", "rank 2"]),
    ({"out__kernel": (None, "rows")}, ["'rows'", "['batch', 'model']"]),
])
def test_bad_layout_maps_are_refused_clearly(entries, words):
    with pytest.raises(ValueError) as raised:
        kmp.parallelize(job.build, strategy="model_parallel", layout_map=user_map(**entries))()
    assert all(word in str(raised.value) for word in words), str(raised.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"strategy": "model_parallel", "micro_batches": 2}, ["micro_batches=2", "JAX"]),
    ({"strategy": "auto", "layout_map": user_map()}, ["layout_map", "'auto'"]),
    ({"strategy": "model_parallel", "layout_map": {"a": 1}}, ["LayoutMap", "{'a': 1}"]),
])
def test_bad_arguments_are_refused_clearly(kwargs, words):
    with pytest.raises(ValueError) as raised:
        kmp.parallelize(job.build, **kwargs)()
    assert all(word in str(raised.value) for word in words), str(raised.value)


def test_devices_choose_the_model_axis():
    model = kmp.parallelize(job.build, strategy="model_parallel", devices=["cpu:1"])()
    assert [s.device.id for s in model.weights[0].value.addressable_shards] == [1]
    with pytest.raises(ValueError, match=r"devices=\['gpu:7'\]"):
        kmp.parallelize(job.build, strategy="model_parallel", devices=["gpu:7"])()


def test_tensorflow_lane_refuses_a_layout_map():
    from keras_mgpu_plugins.backends import tensorflow

    with pytest.raises(ValueError, match="layout_map applies on the JAX backend only"):
        tensorflow.parallelize_factory(None, layout_map=user_map(), strategy="model_parallel")


@pytest.mark.slow
@pytest.mark.multi_worker
def test_hybrid_two_processes_of_two_devices_train_as_one_device(tmp_path):
    runs = kmp.launch(job.hybrid_job, num_workers=2, args=(str(tmp_path),), timeout=200,
                      env=DEVICES)
    for name in OPTIMIZERS:
        expected = reference(name)
        first, second = (run[name] for run in runs)
        assert first["history"] == second["history"]  # identical logs on both processes
        for run in runs:
            assert run["processes"] == 2 and run["local_devices"] == 2
            assert run[name]["mesh"] == {"batch": 2, "model": 2}
            assert run[name]["shards"] == [(96, 16), (96, 16)]
            assert_as_one_device(run[name], expected, run[name]["weights"])
        assert "Hybrid: 2 workers" in first["report"]
        assert first["get_weights"] == "works"  # plain Keras reads the sharded weights
        loaded = keras.saving.load_model(tmp_path / f"{name}.keras")  # plain Keras, one device
        for got, want in zip(loaded.get_weights(), first["weights"], strict=True):
            np.testing.assert_allclose(got, want, atol=0, rtol=0)
