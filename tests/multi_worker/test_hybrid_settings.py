"""strategy="hybrid" with the fit settings: 2 workers (kmp.launch) x 2 simulated devices.

`steps_per_execution`, `micro_batches`, gradient accumulation and mixed precision train as one
process on the same global batches.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.multi_worker.test_hybrid import EPOCHS, GLOBAL_BATCH, make_data, mlp

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(200)]


def settings_job():
    import keras
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    kmp.simulate_devices(2)
    x, y = make_data()
    seen = {}

    def fit(model, **kwargs):
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False,
                            verbose=0, **kwargs)
        return {"weights": model.get_weights(), "loss": history.history["loss"],
                "devices": sorted({v.value.device[-5:] for v in model.weights})}

    model = kmp.parallelize(strategy="hybrid")(mlp)()
    with model.distribute_strategy.scope():  # an optimizer made later: in the scope, as always
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse",
                      steps_per_execution=2)
    seen["steps_per_execution"] = fit(model)
    model = kmp.parallelize(strategy="hybrid", micro_batches=2)(mlp)()
    seen["micro_batches"] = fit(model)
    seen["evaluate"] = model.evaluate(x[:40], y[:40], batch_size=GLOBAL_BATCH, verbose=0)
    seen["predict"] = model.predict(x[:20], batch_size=8, verbose=0)  # a last batch of 4
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = kmp.parallelize(strategy="hybrid")(mlp)()
        seen["mixed"] = fit(model)
        seen["mixed"]["optimizer"] = type(model.optimizer).__name__
    finally:
        keras.mixed_precision.set_global_policy("float32")

    rows = []

    class Recorder(keras.layers.Layer):
        """Identity; records the first feature of every row this worker trains on."""

        def call(self, inputs, training=False):
            if training:
                def append(values):
                    rows.append(values.copy())
                    return np.int64(0)

                token = tf.numpy_function(append, [inputs[:, 0]], tf.int64)
                with tf.control_dependencies([token]):
                    return tf.identity(inputs)
            return inputs

    def recording():
        inputs = keras.Input((6,))
        model = keras.Model(inputs, keras.layers.Dense(1)(Recorder()(inputs)))
        model.compile(optimizer="sgd", loss="mse")
        return model

    kmp.parallelize(strategy="hybrid")(recording)().fit(x, y, batch_size=GLOBAL_BATCH,
                                                       epochs=1, shuffle=False, verbose=0)
    seen["rows"] = rows

    def accumulate():
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5, gradient_accumulation_steps=2),
                      loss="mse")
        return model

    model = kmp.parallelize(strategy="hybrid")(accumulate)()
    seen["accumulation"] = fit(model)
    seen["accumulation"]["iterations"] = int(model.optimizer.iterations.numpy())
    return seen


@pytest.fixture(scope="module")
def results():
    return kmp.launch(settings_job, num_workers=2, create_strategy=False, timeout=180)


def single(model_out=None, **compile_kwargs):
    x, y = make_data()
    model = mlp()
    if compile_kwargs:
        import keras

        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse",
                      **compile_kwargs)
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    if model_out is not None:
        model_out.append(model)
    return model.get_weights()


@pytest.mark.parametrize("setting", ["steps_per_execution", "micro_batches"])
def test_setting_trains_as_one_process(results, setting):
    chief, other = (r[setting] for r in results)
    want = single(steps_per_execution=2) if setting == "steps_per_execution" else single()
    assert chief["loss"] == other["loss"] and chief["devices"] == ["CPU:0", "CPU:1"]
    for a, b, w in zip(chief["weights"], other["weights"], want, strict=True):
        assert np.array_equal(a, b)
        assert np.max(np.abs(a - w)) < 1e-5


def test_evaluate_and_predict_match_one_process(results):
    x, y = make_data()
    models = []
    single(models)
    want_eval = models[0].evaluate(x[:40], y[:40], batch_size=GLOBAL_BATCH, verbose=0)
    want_pred = models[0].predict(x[:20], batch_size=8, verbose=0)
    for seen in results:
        np.testing.assert_allclose(seen["evaluate"], want_eval, rtol=1e-5)
        assert seen["predict"].shape == (20, 1)  # every row once, in order
        np.testing.assert_allclose(seen["predict"], want_pred, atol=1e-5)


def test_each_worker_trains_on_its_own_half_of_every_global_batch(results):
    x, _ = make_data()
    row_of = {float(v): i for i, v in enumerate(x[:, 0])}
    rows = [[sorted(row_of[float(v)] for v in batch) for batch in r["rows"]] for r in results]
    steps = len(x) // GLOBAL_BATCH
    assert [len(r) for r in rows] == [steps, steps]
    for step, (a, b) in enumerate(zip(*rows, strict=True)):
        assert len(a) == len(b) == GLOBAL_BATCH // 2 and not set(a) & set(b)
        assert sorted(a + b) == list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))


def test_mixed_precision_trains_placed_and_identical_on_both_workers(results):
    chief, other = (r["mixed"] for r in results)
    assert chief["optimizer"] == "LossScaleOptimizer" and chief["devices"] == ["CPU:0", "CPU:1"]
    assert chief["loss"] == other["loss"] and np.isfinite(chief["loss"]).all()
    assert chief["loss"][-1] < chief["loss"][0]
    want = single()
    for a, b, w in zip(chief["weights"], other["weights"], want, strict=True):
        assert a.dtype == np.float32 and np.array_equal(a, b)
        assert np.max(np.abs(a - w)) < 1e-2  # float16 compute


def test_gradient_accumulation_trains_placed_as_one_process(results):
    """kmp's gradient_accumulation_under_distribution patch: the accumulators live beside their
    variables, one all-reduce per applied update."""
    import keras

    x, y = make_data()
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5, gradient_accumulation_steps=2),
                  loss="mse")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    chief, other = (r["accumulation"] for r in results)
    assert chief["devices"] == ["CPU:0", "CPU:1"] and chief["loss"] == other["loss"]
    assert chief["iterations"] == int(model.optimizer.iterations.numpy()) == 6
    for a, b, w in zip(chief["weights"], other["weights"], model.get_weights(), strict=True):
        assert np.array_equal(a, b)
        assert np.max(np.abs(a - w)) < 1e-5
