"""The torch lane on the real device, one process: run by the GPU run's `torch` part
(`pytest -m gpu tests/torch`, `KMP_TESTS_REAL_DEVICES=1`); skipped everywhere else.

On a GPU each test asserts what the GPU gives; in the GPU run's CPU dry run
(`KMP_GPU_DRY_RUN=1`) the same code runs on the CPU and asserts what a CPU gives.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import torch

import keras_mgpu_plugins as kmp

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]
ROWS, BATCH, FEATURES = 512, 64, 32


@pytest.fixture
def device() -> str:
    """`"cuda"`, or `"cpu"` in the GPU run's dry run (else skipped without a GPU)."""
    if not torch.cuda.is_available() and os.environ.get("KMP_GPU_DRY_RUN") != "1":
        pytest.skip("needs a GPU; torch sees none")
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def no_tf32():
    """float32 products in float32 (no TF32): kmp and plain Keras within 1e-5."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    return x, rng.integers(0, 10, size=ROWS)


def classifier() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_parallelize_trains_on_the_device_as_plain_keras(device, no_tf32):
    x, y = data()
    model = kmp.parallelize(classifier)()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    plain = classifier()
    plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert {v.value.device.type for v in model.weights} == {device}
    assert history.history["loss"][-1] < history.history["loss"][0]
    for a, b in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_device_metrics_logger_reads_torch_cuda_allocator(device):
    x, y = data()
    model = kmp.parallelize(classifier)()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[
        kmp.callbacks.DeviceMetricsLogger(batch_size=BATCH, summary=False)])
    keys = {k: v[-1] for k, v in history.history.items() if k.startswith("device/GPU")}
    assert history.history["throughput/samples_per_sec"][-1] > 0
    if device == "cpu":
        assert keys == {}
        return
    name = f"GPU:{torch.cuda.current_device()}"
    peak = keys[f"device/{name}/peak_memory_mb"]
    assert 0 < keys[f"device/{name}/memory_mb"] <= peak
    assert peak * 2**20 <= torch.cuda.max_memory_allocated() * 1.01
