"""`backends/jax/batches.distribute`, kmp's `_distribute_data`, in this process (1 device)."""

from __future__ import annotations

import keras
import numpy as np

from keras_mgpu_plugins.backends.jax import batches


def kmp_distribution():
    distribution = keras.distribution.DataParallel()
    setattr(distribution, batches.KMP_OWNED, True)
    return distribution


def test_keras_own_further_arguments_reach_keras_and_a_super_batch_is_keras_own():
    """Keras 3.16 (keras-nightly) calls `_distribute_data(data, is_super_batch=True)` for the
    stacked batches of steps_per_execution (batch axis second): kmp passes it on and leaves
    that layout to Keras, instead of failing with a TypeError in every fit."""
    calls = []

    def original(data, layouts=None, **kwargs):
        calls.append(kwargs)
        return data

    super_batch = np.zeros((3, 5, 2), "float32")  # 3 steps of 5 rows: rows would say 3
    keras.distribution.set_distribution(kmp_distribution())
    assert batches.distribute(original, super_batch, None, is_super_batch=True) is super_batch
    assert batches.distribute(original, np.zeros((4, 2)), None, is_super_batch=False) is not None
    keras.distribution.set_distribution(None)
    assert batches.distribute(original, super_batch, None, is_super_batch=True) is super_batch
    assert calls == [{"is_super_batch": True}, {"is_super_batch": False},
                     {"is_super_batch": True}]
