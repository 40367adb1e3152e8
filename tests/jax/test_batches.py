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


def test_planned_devices_are_every_gpu_the_driver_shows_without_cuda_visible_devices(
        monkeypatch):
    """A GPU machine where CUDA_VISIBLE_DEVICES is unset: JAX (with its CUDA plugin) starts on
    every GPU, so kmp plans them, not the CPU (the driver is faked: no GPU here; the GPU run
    records the real answer before JAX starts, benchmarks/gpu)."""
    import jax

    from keras_mgpu_plugins.backends.jax import devices
    from keras_mgpu_plugins.cluster import local_devices

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "")
    monkeypatch.setattr(local_devices, "_has_gpu_driver", lambda: True)
    monkeypatch.setattr(local_devices, "gpus_on_driver", lambda: 2)
    monkeypatch.setattr(devices, "_jax_gpu_plugin", lambda: True)
    previous = jax.config.jax_platforms
    jax.config.update("jax_platforms", None)
    try:
        assert devices.planned_device_names() == ("GPU:0", "GPU:1")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        assert devices.planned_device_names() == ("GPU:0",)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        monkeypatch.setattr(devices, "_jax_gpu_plugin", lambda: False)  # JAX without CUDA: CPU
        assert devices.planned_device_names()[0] == "CPU:0"
    finally:
        jax.config.update("jax_platforms", previous)
