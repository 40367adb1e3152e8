"""Fine-tuning (keras.io's transfer-learning recipe) on 2 simulated devices trains as one device.

The recipe (`tests/transfer_learning_recipe.py`) compiles again outside the
strategy's scope with an optimizer and a metric made in the `compile(...)` call:
kmp's `compile_adopts_state_made_outside` takes them into the model's strategy.
"""

from __future__ import annotations

import numpy as np
import pytest

from keras_mgpu_plugins import compat
from tests import transfer_learning_recipe as recipe

pytestmark = pytest.mark.timeout(300)

PATCH = "compile_adopts_state_made_outside"
CASES = [("schedule", True), ("adam", True), ("schedule", False), ("adam", False)]


@pytest.fixture(scope="module")
def one_device():
    return {case: recipe.run("default", *case) for case in CASES}


@pytest.fixture
def without_the_patch():
    yield PATCH
    compat.patch_keras()


def assert_same_training(got, want):
    assert got["iterations"] == want["iterations"] == [8, 8]
    assert recipe.max_difference(got["weights"], want["weights"]) < 1e-5
    for phase, (mine, theirs) in enumerate(zip(got["histories"], want["histories"], strict=True)):
        assert mine.keys() == theirs.keys() == {"loss", "binary_accuracy"}
        for key, values in theirs.items():
            np.testing.assert_allclose(mine[key], values, atol=1e-5, err_msg=f"{phase} {key}")


@pytest.mark.parametrize(("fine_tune", "require_compiled"), CASES)
def test_the_fine_tuning_recipe_matches_one_device(one_device, fine_tune, require_compiled):
    """Iterations, weights and History of both phases; the model trains with the user's object."""
    two = recipe.run("mirrored", fine_tune, require_compiled)
    assert_same_training(two, one_device[fine_tune, require_compiled])
    assert two["same_optimizer"]


def test_without_the_patch_a_schedule_decays_twice_as_fast(one_device, without_the_patch):
    """Keras as released: each replica adds one to a plain `iterations` (16 for 8 steps)."""
    two = recipe.run("mirrored", "schedule", True, without=without_the_patch)
    assert two["iterations"] == [8, 16]
    assert recipe.max_difference(two["weights"], one_device["schedule", True]["weights"]) > 1e-4


def test_without_the_patch_adam_made_outside_fails_in_fit(without_the_patch):
    with pytest.raises(RuntimeError, match="Mixing different tf.distribute.Strategy objects"):
        recipe.run("mirrored", "adam", True, without=without_the_patch)


def test_an_optimizer_that_trained_outside_the_strategy_is_refused_naming_the_model():
    import keras

    import keras_mgpu_plugins as kmp

    used = keras.optimizers.Adam(1e-3)
    alone = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
    alone.compile(optimizer=used, loss="mse")
    x, y = recipe.make_images(rows=8)
    alone.fit(x, y, epochs=1, verbose=0)
    model = kmp.parallelize(strategy="mirrored")(recipe.factory(compiled=True))()
    with pytest.raises(ValueError, match=rf"model {model.name!r}: the optimizer Adam "
                                         rf"{used.name!r} .* already built outside .* Pass a "
                                         r"new Adam\(\.\.\.\)"):
        model.compile(optimizer=used, loss="mse")


def test_optimizers_and_metrics_are_taken_in_where_they_are_and_keep_their_state():
    """The same objects, values and paths; a wrapped optimizer's inner one; one-device models
    and a compile in the model's own scope leave them alone."""
    import keras

    import keras_mgpu_plugins as kmp

    model = kmp.parallelize(strategy="mirrored")(recipe.factory(compiled=True))()
    inner = keras.optimizers.SGD(0.25)
    inner.iterations.assign(3)
    optimizer = keras.optimizers.LossScaleOptimizer(inner)
    metric = keras.metrics.BinaryAccuracy()
    paths = [v.path for v in (*optimizer.variables, *metric.variables)]
    model.compile(optimizer=optimizer, loss="mse", metrics=[[metric]])
    strategy = model.distribute_strategy
    for variable in (*optimizer.variables, *inner.variables, *metric.variables):
        assert strategy.extended.variable_created_in_scope(variable.value), variable.path
    assert [v.path for v in (*optimizer.variables, *metric.variables)] == paths
    assert int(inner.iterations.numpy()) == 3 and float(inner.learning_rate.numpy()) == 0.25
    assert model.optimizer is optimizer and optimizer.inner_optimizer is inner
    assert inner._distribution_strategy is strategy and metric.total is metric.variables[0]

    alone = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    plain = keras.optimizers.SGD(0.1)
    before = list(plain.variables)
    alone.compile(optimizer=plain, loss="mse")
    assert [id(v) for v in plain.variables] == [id(v) for v in before]


def two_optimizer_model_class():
    """keras.io's GAN shape: `compile` keeps a second optimizer itself, `train_step` uses both."""
    import keras

    class TwoOptimizers(keras.Model):
        def __init__(self):
            super().__init__()
            self.first = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(1))
            self.second = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2))

        def call(self, x):
            return self.second(self.first(x))

        def compile(self, first_optimizer, second_optimizer, loss):
            super().compile(optimizer=first_optimizer, loss=loss)
            self.second_optimizer = second_optimizer
            # Built here: an optimizer first built inside the distributed step fails under
            # MirroredStrategy whatever its scope (a placeholder fed by no one, in a cond).
            second_optimizer.build(self.second.trainable_variables)

        def train_step(self, data):
            import tensorflow as tf

            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            first, second = self.first.trainable_variables, self.second.trainable_variables
            grads = tape.gradient(loss, first + second)
            self.optimizer.apply_gradients(zip(grads[:len(first)], first, strict=True))
            self.second_optimizer.apply_gradients(zip(grads[len(first):], second, strict=True))
            return {"loss": loss}

    return TwoOptimizers


def two_optimizer_run(strategy):
    import keras

    import keras_mgpu_plugins as kmp

    cls = two_optimizer_model_class()

    def build():
        model = cls()
        model(np.zeros((1, 4), "float32"))
        return model

    model = kmp.parallelize(strategy=strategy, require_compiled=False)(build)()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=2, decay_rate=0.5)
    second = keras.optimizers.Adam(schedule)
    model.compile(keras.optimizers.SGD(schedule), second, "mse")  # made outside the scope
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 4)).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=2, shuffle=False, verbose=0)
    return {"iterations": [int(o.iterations.numpy()) for o in (model.optimizer, second)],
            "weights": model.get_weights(), "kept": model.second_optimizer is second}


def test_a_compile_of_its_own_keeping_a_second_optimizer_trains_as_one_device():
    """kmp's overridden_compile_adopts_its_arguments: Keras's compile never sees the second."""
    one, two = two_optimizer_run("default"), two_optimizer_run("mirrored")
    assert two["iterations"] == one["iterations"] == [8, 8] and two["kept"]
    assert recipe.max_difference(two["weights"], one["weights"]) < 1e-5


def test_without_it_the_second_optimizer_counts_each_replicas_step(monkeypatch):
    """Keras's compile adopts the first optimizer; the second, left outside, counts 16."""
    from keras_mgpu_plugins.backends.tensorflow import parallelize as tf_parallelize

    one = two_optimizer_run("default")
    monkeypatch.setattr(tf_parallelize, "_adopt_in_overridden_compile", lambda *args: None)
    two = two_optimizer_run("mirrored")
    assert two["iterations"] == [8, 16]
    assert recipe.max_difference(two["weights"], one["weights"]) > 1e-4
