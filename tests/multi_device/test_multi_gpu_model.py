"""kmp.multi_gpu_model over the 2 logical CPU devices of tests/conftest.py."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mgpu_plugins as kmp


def data(n=64, features=6):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype("float32")
    return x, (x @ rng.normal(size=(features, 1))).astype("float32")


def init(seed):
    return keras.initializers.GlorotUniform(seed=seed)


def sequential(seed=1):
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", kernel_initializer=init(seed)),
            keras.layers.Dense(1, kernel_initializer=init(seed + 1)),
        ]
    )


def functional(seed=1):
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", kernel_initializer=init(seed))(inputs)
    outputs = keras.layers.Dense(1, kernel_initializer=init(seed + 1))(hidden)
    return keras.Model(inputs, outputs, name="functional_template")


@keras.saving.register_keras_serializable(package="kmp_tests")
class TwoLayer(keras.Model):
    def __init__(self, units=8, seed=1, **kwargs):
        super().__init__(**kwargs)
        self.units, self.seed = units, seed
        self.hidden = keras.layers.Dense(units, activation="tanh", kernel_initializer=init(seed))
        self.out = keras.layers.Dense(1, kernel_initializer=init(seed + 1))

    def call(self, x):
        return self.out(self.hidden(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units, "seed": self.seed}


def subclassed(seed=1):
    model = TwoLayer(seed=seed)
    model(np.zeros((1, 6), "float32"))  # built by a call, as subclassed models usually are
    return model


BUILDERS = {"sequential": sequential, "functional": functional, "subclassed": subclassed}


def replicate(model, **kwargs):
    """multi_gpu_model without its no-GPU warning (tested on its own below)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No GPU found")
        return kmp.multi_gpu_model(model, **kwargs)


def assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_template_holds_the_trained_weights(kind):
    model = BUILDERS[kind]()
    before = model.get_weights()
    parallel_model = replicate(model, gpus=2)
    assert type(parallel_model) is type(model)
    assert parallel_model is not model
    assert parallel_model.distribute_strategy.num_replicas_in_sync == 2
    kernel = parallel_model.trainable_variables[0].value
    assert len(parallel_model.distribute_strategy.experimental_local_results(kernel)) == 2
    assert_same(parallel_model.get_weights(), before)  # copied at creation

    parallel_model.compile(optimizer="sgd", loss="mse")  # outside any scope, as the recipe
    x, y = data()
    parallel_model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert_same(model.get_weights(), parallel_model.get_weights())
    assert not np.array_equal(model.get_weights()[0], before[0])  # it did train


def test_template_is_updated_at_each_epoch_end_before_user_callbacks():
    model = sequential()
    parallel_model = replicate(model)
    parallel_model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            same = all(
                np.array_equal(a, b)
                for a, b in zip(model.get_weights(), self.model.get_weights(), strict=True)
            )
            seen.append((same, model.get_weights()[0].copy()))

    x, y = data()
    parallel_model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[Probe()])
    assert [same for same, _ in seen] == [True, True, True]
    assert not np.array_equal(seen[0][1], seen[1][1])  # a new copy each epoch


def test_training_matches_one_device():
    """SGD, no shuffle, same global batches: 2 replicas end where one device ends."""
    x, y = data()
    single = sequential()
    single.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    single.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    model = sequential()
    parallel_model = replicate(model, gpus=2)
    parallel_model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = parallel_model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 3
    for a, b in zip(single.get_weights(), model.get_weights(), strict=True):
        assert np.max(np.abs(a - b)) < 1e-5
    assert (
        parallel_model.optimizer.iterations.numpy() == 3 * 64 // 16
    )  # counted once, not per replica


def test_optimizer_instance_made_outside_the_scope():
    """Adam's slot variables need the strategy: the instance is re-made in the scope."""
    model = functional()
    parallel_model = replicate(model)
    adam = keras.optimizers.Adam(learning_rate=0.01, beta_1=0.8)
    parallel_model.compile(adam, loss="mse", metrics=[keras.metrics.MeanAbsoluteError()])
    x, y = data()
    history = parallel_model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert parallel_model.optimizer.beta_1 == 0.8
    assert float(parallel_model.optimizer.learning_rate.numpy()) == pytest.approx(0.01)
    assert np.isfinite(history.history["mean_absolute_error"][0])
    assert parallel_model.optimizer.iterations.numpy() == 4


def test_variables_are_not_shared():
    model = sequential()
    parallel_model = replicate(model)
    template_vars = {id(v.value) for v in model.weights}
    assert not template_vars & {id(v.value) for v in parallel_model.weights}
    original = model.get_weights()
    parallel_model.set_weights([w + 1.0 for w in original])
    assert_same(model.get_weights(), original)
    model.set_weights([w * 0.0 for w in original])
    assert_same(parallel_model.get_weights(), [w + 1.0 for w in original])


def test_evaluate_copies_weights_and_template_loads_are_taken_in():
    """Legacy models shared weights: weights loaded into the template are used next."""
    x, y = data()
    model = sequential()
    parallel_model = replicate(model)
    parallel_model.compile(optimizer="sgd", loss="mse")
    parallel_model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    loaded = [np.full_like(w, 0.01) for w in model.get_weights()]
    model.set_weights(loaded)  # e.g. model.load_weights("best.weights.h5")
    loss = parallel_model.evaluate(x, y, batch_size=16, verbose=0)
    assert_same(parallel_model.get_weights(), loaded)
    reference = sequential()
    reference.set_weights(loaded)
    reference.compile(loss="mse")
    assert loss == pytest.approx(reference.evaluate(x, y, batch_size=16, verbose=0), rel=1e-6)
    np.testing.assert_allclose(
        parallel_model.predict(x, verbose=0), reference.predict(x, verbose=0), rtol=1e-6
    )


def test_predict_in_a_loop_reads_no_weight_until_the_template_is_given_some(monkeypatch):
    """Legacy loops call predict often: with nothing changed, no weight is read."""
    from keras_mgpu_plugins.backends.tensorflow import multi_gpu_link as _multi_gpu_link

    x, _ = data()
    model = sequential()
    parallel_model = replicate(model)
    parallel_model.compile(optimizer="sgd", loss="mse")
    reads = []
    real_get, real_fingerprint = keras.Model.get_weights, _multi_gpu_link.weights_fingerprint
    monkeypatch.setattr(keras.Model, "get_weights",
                        lambda self: reads.append(self.name) or real_get(self))
    monkeypatch.setattr(_multi_gpu_link, "weights_fingerprint",
                        lambda weights: reads.append("fingerprint") or real_fingerprint(weights))
    first = parallel_model.predict(x, verbose=0)
    for _ in range(3):
        np.testing.assert_array_equal(parallel_model.predict(x, verbose=0), first)
    assert reads == []
    loaded = [np.full_like(w, 0.01) for w in real_get(model)]
    model.set_weights(loaded)  # as model.load_weights(...) would: taken in at the next call
    reference = sequential()
    reference.set_weights(loaded)
    np.testing.assert_allclose(parallel_model.predict(x, verbose=0),
                               reference.predict(x, verbose=0), rtol=1e-6)
    assert reads and "fingerprint" in reads
    reads.clear()
    parallel_model.predict(x, verbose=0)
    assert reads == []


def test_changing_both_warns_and_keeps_the_parallel_weights():
    model = sequential()
    parallel_model = replicate(model)
    parallel_model.compile(optimizer="sgd", loss="mse")
    original = model.get_weights()
    model.set_weights([w * 0.5 for w in original])
    parallel_model.set_weights([w * 2.0 for w in original])
    x, y = data()
    with pytest.warns(UserWarning, match="weights of both the template model and the parallel"):
        parallel_model.evaluate(x, y, verbose=0)
    assert_same(parallel_model.get_weights(), [w * 2.0 for w in original])
    assert_same(model.get_weights(), [w * 2.0 for w in original])


def test_early_stopping_restore_reaches_the_template():
    x, y = data()
    model = sequential()
    parallel_model = replicate(model)
    parallel_model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=5, restore_best_weights=True)
    parallel_model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[stop])
    assert_same(model.get_weights(), stop.best_weights)


def test_fit_with_positional_callbacks_and_validation():
    x, y = data()
    model = functional()
    parallel_model = replicate(model)
    parallel_model.compile(optimizer="sgd", loss="mse")
    history = keras.callbacks.History()
    parallel_model.fit(x, y, 16, 2, 0, [history], validation_split=0.25)
    assert len(history.history["val_loss"]) == 2
    assert_same(model.get_weights(), parallel_model.get_weights())


def test_saving_through_the_template(tmp_path):
    model = subclassed()
    parallel_model = replicate(model)
    parallel_model.compile(optimizer="sgd", loss="mse")
    x, y = data()
    parallel_model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    model.save(tmp_path / "my_model.keras")
    restored = keras.saving.load_model(tmp_path / "my_model.keras")
    assert isinstance(restored, TwoLayer)
    assert_same(restored.get_weights(), parallel_model.get_weights())


def test_a_compiled_template_and_a_device_scope():
    with tf.device("/cpu:0"):  # the recipe builds the template on the CPU
        model = sequential()
        model.compile(optimizer="adam", loss="mse")
    parallel_model = replicate(model)
    assert parallel_model.compiled  # clone_model carries the compile config over
    x, y = data()
    parallel_model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert_same(model.get_weights(), parallel_model.get_weights())


def test_no_gpu_warns_and_uses_the_logical_cpus():
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("a GPU is present")
    with pytest.warns(
        UserWarning, match="No GPU found: multi_gpu_model replicates the model over 2 logical CPU"
    ):
        parallel_model = kmp.multi_gpu_model(sequential())
    assert parallel_model.distribute_strategy.extended.worker_devices == (
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:CPU:1",
    )


def test_more_devices_than_exist():
    with pytest.raises(
        ValueError, match=r"gpus=3\) needs 3 devices, but this process sees .*\b2\b"
    ):
        replicate(sequential(), gpus=3)


@pytest.mark.parametrize("gpus", [0, 1])
def test_gpus_below_two(gpus):
    with pytest.raises(ValueError, match="gpus must be >= 2"):
        replicate(sequential(), gpus=gpus)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cpu_merge": False}, "cpu_merge=False has no effect"),
        ({"cpu_relocation": True}, "cpu_relocation=True has no effect"),
    ],
)
def test_legacy_arguments_warn(kwargs, message):
    with pytest.warns(UserWarning, match=message):
        parallel_model = replicate(sequential(), **kwargs)
    assert parallel_model.distribute_strategy.num_replicas_in_sync == 2


def test_defaults_do_not_warn_about_legacy_arguments():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kmp.multi_gpu_model(sequential(), gpus=2, cpu_merge=True, cpu_relocation=False)
    assert not [w for w in caught if "has no effect" in str(w.message)]


@pytest.mark.parametrize("obj", [object(), keras.layers.Dense(2), "model"])
def test_not_a_keras_model(obj):
    with pytest.raises(TypeError, match="multi_gpu_model takes a Keras 3 model.*Received: model="):
        kmp.multi_gpu_model(obj)


@pytest.mark.filterwarnings("ignore:`build\\(\\)` was called on layer")
def test_unbuilt_model():
    with pytest.raises(ValueError, match="needs a built model.*keras.Input"):
        replicate(keras.Sequential([keras.layers.Dense(2)]))
    built_without_weights = TwoLayer()
    built_without_weights.build((None, 6))  # no build(): Keras marks it built, makes no weight
    with pytest.raises(ValueError, match="needs a built model.*calling it on a batch"):
        replicate(built_without_weights)


def test_subclassed_model_without_a_config():
    class Opaque(keras.Model):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def call(self, x):
            return self.layer(x)

    model = Opaque(keras.layers.Dense(2))
    model(np.zeros((1, 3), "float32"))
    with pytest.raises(TypeError, match=r"Opaque could not be re-created.*get_config\(\)"):
        replicate(model)


def test_replaced_methods_keep_keras_signature_and_doc():
    import inspect

    parallel_model = replicate(sequential())
    assert parallel_model.fit.__doc__ == keras.Model.fit.__doc__
    assert list(inspect.signature(parallel_model.fit).parameters)[:3] == ["x", "y", "batch_size"]
    assert "fit" not in [layer.name for layer in parallel_model.layers]
    assert len(parallel_model.weights) == 4


def test_refused_in_a_multi_worker_job(monkeypatch):
    import json

    from keras_mgpu_plugins.backends.tensorflow.strategy import StrategyError

    cluster = {
        "cluster": {"worker": ["localhost:1", "localhost:2"]},
        "task": {"type": "worker", "index": 0},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    with pytest.raises(StrategyError, match=r"one worker of a multi-worker job.*@kmp.parallelize"):
        kmp.multi_gpu_model(sequential(), gpus=2)


def test_a_callback_list_is_accepted():
    x, y = data()
    model = sequential()
    parallel_model = replicate(model)
    parallel_model.compile(optimizer="sgd", loss="mse")
    history = keras.callbacks.History()
    parallel_model.fit(x, y, epochs=2, verbose=0, callbacks=keras.callbacks.CallbackList([history]))
    assert len(history.history["loss"]) == 2
    assert_same(model.get_weights(), parallel_model.get_weights())


@keras.saving.register_keras_serializable(package="kmp_tests")
class TwoOptimizers(TwoLayer):
    """A GAN-like compile signature: two optimizers, positional."""

    def compile(self, first, second, **kwargs):
        super().compile(optimizer=first, **kwargs)
        self.second = second


def test_every_optimizer_argument_is_made_in_the_scope():
    model = TwoOptimizers()
    model(np.zeros((1, 6), "float32"))
    parallel_model = replicate(model)
    outside = keras.optimizers.Adam(0.003), keras.optimizers.RMSprop(0.002)
    parallel_model.compile(*outside, loss="mse")
    extended = parallel_model.distribute_strategy.extended
    for made, given in [
        (parallel_model.optimizer, outside[0]),
        (parallel_model.second, outside[1]),
    ]:
        assert type(made) is type(given)
        assert float(made.learning_rate.numpy()) == pytest.approx(
            float(given.learning_rate.numpy())
        )
        assert extended.variable_created_in_scope(made.iterations.value)
    parallel_model.fit(*data(), batch_size=16, epochs=1, verbose=0)
    assert_same(model.get_weights(), parallel_model.get_weights())
