"""strategy="hybrid": bad input, and one worker (it is then "model_parallel").

Two short launches for the errors that need several processes (workers with different
numbers of devices; a multi-worker strategy of the user's own); the rest in this process,
over the 2 logical CPU devices of conftest.py.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mgpu_plugins as kmp
from tests.multi_worker.test_hybrid import make_data, mlp


def different_device_counts():
    import keras_mgpu_plugins as kmp

    kmp.simulate_devices(2 + kmp.topology().worker_index)  # worker 0: 2, worker 1: 3
    build = kmp.parallelize(strategy="hybrid")(mlp)
    try:
        build()
    except ValueError as err:
        return str(err)
    return None


def own_strategy_first():
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    tf.distribute.MultiWorkerMirroredStrategy()  # the user's own, never given to kmp
    try:
        kmp.parallelize(strategy="hybrid")(mlp)
    except kmp.strategy.StrategyError as err:
        return str(err)
    return None


@pytest.mark.multi_worker
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_workers_with_different_device_counts_fail_on_every_worker():
    messages = kmp.launch(different_device_counts, num_workers=2, create_strategy=False,
                          timeout=150)
    for message in messages:
        assert message is not None and "same number of local devices" in message
        assert "worker 0: 2, worker 1: 3" in message


@pytest.mark.multi_worker
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_multi_worker_strategy_of_ones_own_is_refused_on_every_worker():
    messages = kmp.launch(own_strategy_first, num_workers=2, create_strategy=False, timeout=150)
    for message in messages:
        assert message is not None and "strategy='hybrid' makes its own" in message
        assert "already has a multi-worker strategy" in message


def test_on_one_worker_hybrid_is_model_parallel():
    x, y = make_data()
    trained = []
    for strategy in ("hybrid", "model_parallel"):
        model = kmp.parallelize(strategy=strategy)(mlp)()
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        trained.append(model)
        assert model.distribute_strategy is tf.distribute.get_strategy()
        devices = {v.path: v.value.device.rsplit("device:", 1)[-1] for v in model.weights}
        assert devices["dense_1/kernel"] == "CPU:0" and devices["head/kernel"] == "CPU:1"
        assert kmp.placement_report(model).num_workers == 1
    for a, b in zip(*(m.get_weights() for m in trained), strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="sync_batchnorm is not available with strategy='hybrid'"):
        kmp.parallelize(strategy="hybrid", sync_batchnorm=True)
    with pytest.raises(ValueError, match="micro_batches must be a positive integer"):
        kmp.parallelize(strategy="hybrid", micro_batches=0)
    with pytest.raises(TypeError, match="did you mean"):
        kmp.parallelize(strategy="hybrid", devices="/cpu:1")(mlp)()
    with pytest.raises(ValueError, match="micro_batches only applies to strategy='model_parallel' "
                                         "or 'hybrid'"):
        kmp.parallelize(strategy="mirrored", micro_batches=2)


def test_called_inside_a_strategy_scope_is_refused():
    build = kmp.parallelize(strategy="hybrid")(mlp)
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        with pytest.raises(ValueError, match="inside the scope of a MirroredStrategy"):
            build()
    assert isinstance(build(), keras.Model)  # outside: fine
