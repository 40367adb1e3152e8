"""Keras 3 fit/evaluate/predict under MultiWorkerMirroredStrategy, 2 real workers.

Numerical truth: with SGD, no shuffle and seeded initialisers, 2 workers end with
the weights one process reaches on the same global batches; both workers hold
bit-identical weights and History; each worker computes on its own half of each
global batch. And the compat patches are needed: without them fit fails.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.versions import prerelease

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(300)]

GLOBAL_BATCH = 16
EPOCHS = 3


def make_data(n=64):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1)) + 0.1).astype("float32")
    return x, y


def build_model(record=None):
    import keras
    import tensorflow as tf

    class RecordingModel(keras.Sequential):
        """Records the first feature of every row a replica trains on."""

        def train_step(self, data):
            if record is not None:
                x = data[0]

                def append(values):
                    record.append(values.copy())
                    return np.int64(0)

                tf.numpy_function(append, [x[:, 0]], tf.int64)
            return super().train_step(data)

    model = RecordingModel(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(3)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(4)),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def train_on_worker():
    import keras_mgpu_plugins as kmp

    x, y = make_data()
    seen: list = []
    model = kmp.parallelize(build_model)(seen)
    history = model.fit(
        x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
        validation_data=(x[:32], y[:32]),
    )
    evaluation = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
    predictions = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    return {
        "strategy": type(model.distribute_strategy).__name__,
        "replicas": model.distribute_strategy.num_replicas_in_sync,
        "weights": model.get_weights(),
        "history": history.history,
        "evaluate": evaluation,
        "predict": predictions,
        "local_predict": model(x).numpy(),
        "seen": seen,
        "tf_data": fit_tf_data_with_a_partial_last_batch(),
        "patches": fit_without_each_patch(),  # last: it unpatches Keras (and patches it back)
    }


def fit_tf_data_with_a_partial_last_batch():
    """A `tf.data` pipeline (the distributed-CNN recipe's input), 72 rows: the last batch is 8."""
    import tensorflow as tf

    x, y = make_data(72)
    model = kmp.parallelize(build_model)()
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).prefetch(2)
    val = tf.data.Dataset.from_tensor_slices((x[:40], y[:40])).batch(GLOBAL_BATCH)
    history = model.fit(train, epochs=EPOCHS, validation_data=val, verbose=0)
    return {"weights": model.get_weights(), "history": history.history,
            "evaluate": model.evaluate(train, verbose=0),
            "predict": model.predict(tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH),
                                     verbose=0)}


@pytest.fixture(scope="module")
def results():
    return kmp.launch(train_on_worker, num_workers=2, timeout=280)


@pytest.fixture(scope="module")
def single():
    import keras

    keras.utils.set_random_seed(0)
    x, y = make_data()
    model = build_model()
    history = model.fit(
        x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
        validation_data=(x[:32], y[:32]),
    )
    return {
        "weights": model.get_weights(),
        "history": history.history,
        "evaluate": model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0),
    }


def test_two_workers_use_multi_worker_strategy(results):
    assert [r["strategy"] for r in results] == ["CollectiveAllReduceStrategy"] * 2
    assert [r["replicas"] for r in results] == [2, 2]


def test_workers_hold_bit_identical_weights_and_history(results):
    first, second = results
    for a, b in zip(first["weights"], second["weights"], strict=True):
        assert np.array_equal(a, b)
    assert first["history"] == second["history"]
    assert first["evaluate"] == second["evaluate"]


def test_same_weights_as_one_process_on_the_same_global_batches(results, single):
    for a, b in zip(results[0]["weights"], single["weights"], strict=True):
        assert np.max(np.abs(a - b)) < 1e-5
    for key in ("loss", "mae", "val_loss", "val_mae"):
        np.testing.assert_allclose(results[0]["history"][key], single["history"][key], atol=1e-5)
    np.testing.assert_allclose(results[0]["evaluate"], single["evaluate"], atol=1e-5)


def test_each_worker_trains_on_its_own_half_of_every_global_batch(results):
    x, _ = make_data()
    row_of = {float(v): i for i, v in enumerate(x[:, 0])}
    steps = len(x) // GLOBAL_BATCH
    rows = [[[row_of[float(v)] for v in batch] for batch in r["seen"]] for r in results]
    assert [len(r) for r in rows] == [steps * EPOCHS] * 2  # one record per step
    for step in range(steps * EPOCHS):
        a, b = rows[0][step], rows[1][step]
        assert len(a) == len(b) == GLOBAL_BATCH // 2
        assert not set(a) & set(b)  # disjoint halves
        start = (step % steps) * GLOBAL_BATCH
        assert sorted(a + b) == list(range(start, start + GLOBAL_BATCH))  # the global batch


def test_tf_data_with_a_partial_last_batch_matches_one_process(results):
    import keras

    keras.utils.set_random_seed(0)
    x, y = make_data(72)
    model = build_model()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(x[:40], y[:40]))
    first, second = (r["tf_data"] for r in results)
    assert first["history"] == second["history"] and first["evaluate"] == second["evaluate"]
    for a, b, want in zip(first["weights"], second["weights"], model.get_weights(), strict=True):
        assert np.array_equal(a, b)
        np.testing.assert_allclose(a, want, atol=1e-5)
    for key, values in history.history.items():
        np.testing.assert_allclose(first["history"][key], values, rtol=1e-5)
    np.testing.assert_allclose(first["evaluate"][0], model.evaluate(x, y, verbose=0)[0], rtol=1e-5)
    assert first["predict"].shape == (72, 1)  # every row once, in order
    np.testing.assert_allclose(first["predict"], model.predict(x, verbose=0), atol=1e-5)


def test_predict_returns_every_row_in_the_original_order(results):
    for r in results:
        assert r["predict"].shape == (64, 1)
        np.testing.assert_allclose(r["predict"], r["local_predict"], atol=1e-6)


def fit_with_only(names):
    """One fit with only the named patches applied; the error, or None."""
    import keras_mgpu_plugins as kmp

    kmp.compat.unpatch_keras()
    undo = [p.apply() for p in kmp.compat.PATCHES if p.name in names]
    x, y = make_data()
    patch_keras, kmp.compat.patch_keras = kmp.compat.patch_keras, lambda: []  # parallelize's
    try:
        model = kmp.parallelize(build_model)()
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    except Exception as err:  # the upstream failure, keras-team/keras#20585
        return f"{type(err).__name__}: {str(err)[:300]}"
    finally:
        kmp.compat.patch_keras = patch_keras
        for u in reversed(undo):
            u()
        kmp.compat.patch_keras()
    return None


def fit_without_each_patch():
    from keras_mgpu_plugins import compat

    names = [p.name for p in compat.PATCHES if p.upstream.endswith("/20585")]
    runs = {"none": fit_with_only([])}
    for name in names:  # every patch but this one
        runs[f"all but {name}"] = fit_with_only([n for n in names if n != name])
    runs["all"] = fit_with_only(names)
    return runs


def test_compat_patches_are_needed_each_one(results):
    """Fails if upstream Keras fixed keras-team/keras#20585 (or one half of it): drop that patch."""
    for worker in (r["patches"] for r in results):
        assert worker["all"] is None
        assert "PerReplica" in worker["none"]  # the symbolic build fails first
        assert "PerReplica" in worker["all but symbolic_build_per_replica_batch"]
        assert worker["all but multi_worker_scalar_log_reduce"].startswith(  # scalar logs, axis=0
            "ValueError: Invalid reduction dimension 0 for input with 0 dimensions")


def fit_under_own_strategy():
    """A script that makes its own MultiWorkerMirroredStrategy and hands it to parallelize."""
    import tensorflow as tf

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.compat import _registry as _compat_patches

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert not _compat_patches._applied  # nothing has patched Keras in this worker yet
    x, y = make_data()
    model = kmp.parallelize(strategy=strategy)(build_model)()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    return history.history["loss"]


def test_own_multi_worker_strategy_gets_the_keras_fixes():
    # No launcher watchdog: its patch of fit would be in force before the script's strategy.
    losses = kmp.launch(fit_under_own_strategy, num_workers=2, create_strategy=False, timeout=240,
                        stall_timeout=None)
    assert losses[0] == losses[1] and len(losses[0]) == 1


def fit_in_own_strategy_scope_with_kmp_callbacks():
    """kmp.compat.patch_keras() and a model built in the scope of the script's own
    MultiWorkerMirroredStrategy, no decorator: one model over the job, kmp's callbacks act for
    it (not refused as separate models: `runtime.apart`)."""
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    kmp.compat.patch_keras()
    x, y = make_data()
    with strategy.scope():
        model = build_model()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, verbose=0,
                        callbacks=[kmp.callbacks.EarlyStopping(monitor="loss", patience=1)])
    return history.history["loss"], [w.tolist() for w in model.get_weights()]


def test_a_model_in_the_scripts_own_strategy_scope_trains_with_kmp_callbacks():
    results = kmp.launch(fit_in_own_strategy_scope_with_kmp_callbacks, num_workers=2,
                         create_strategy=False, timeout=240, stall_timeout=None)
    (losses0, weights0), (losses1, weights1) = results
    assert losses0 == losses1 and len(losses0) == 2 and weights0 == weights1  # one model


def test_patch_keras_is_idempotent_and_version_guarded():
    from keras_mgpu_plugins import compat

    first = compat.patch_keras()
    assert compat.patch_keras() == first
    assert set(first) == {p.name for p in compat.PATCHES if p.kind == "workaround"}
    for patch in compat.PATCHES:
        assert patch.upstream.startswith(("https://github.com/keras-team/keras/",
                                          "https://github.com/tensorflow/tensorflow/"))
        # a release CI runs is in every checked range, a nightly in none (tests/versions.py)
        assert patch.applies_to(patch.installed_version()) is not prerelease(patch.library)
        assert not patch.applies_to(patch.max_version)
