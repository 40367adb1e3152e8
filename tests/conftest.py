"""Shared test setup.

The test process splits its CPU into 2 logical devices before TensorFlow starts,
so single-process tests can use `MirroredStrategy` over 2 replicas
(`kmp.parallelize(strategy="mirrored")`) beside ordinary one-device tests.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.pop("TF_CONFIG", None)  # a stray cluster would change every test

NUM_SIMULATED_DEVICES = 2


def pytest_configure(config):
    import keras

    import keras_mgpu_plugins as kmp

    if keras.backend.backend() in ("tensorflow", "jax"):  # the backends with distributed fit
        kmp.simulate_devices(NUM_SIMULATED_DEVICES)
