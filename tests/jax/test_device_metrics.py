"""DeviceMetricsLogger on JAX without `batch_size=`: one clear hint, no false "Keras changed".

JAX's trainer updates Keras's loss tracker outside `train_step` (and each process counts
the global batch), so kmp does not count rows there: `batch_size=` gives samples/s.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np

import keras_mgpu_plugins as kmp
from tests.versions import without_expected_notes


def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def fit(**kwargs):
    x = np.arange(256, dtype="float32").reshape(64, 4) / 256
    y = np.zeros((64, 2), "float32")
    seen = {}

    class Keys(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.update(logs)

    logger = kmp.callbacks.DeviceMetricsLogger(summary=False, sample_interval=None, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[logger, Keys()])
    return without_expected_notes([str(w.message) for w in caught]), seen


def test_without_batch_size_one_hint_names_it_and_no_private_api_warning():
    messages, keys = fit()
    hints = [m for m in messages if "DeviceMetricsLogger" in m and "batch_size=" in m]
    assert len(hints) == 1 and "on jax" in hints[0]
    assert not [m for m in messages if "relies on private" in m or "no longer updates" in m]
    assert "throughput/samples_per_sec" not in keys and "step_time/mean_ms" in keys


def test_with_batch_size_no_hint_and_samples_per_second():
    messages, keys = fit(batch_size=8)
    assert not [m for m in messages if "DeviceMetricsLogger" in m or "relies on private" in m]
    assert keys["throughput/samples_per_sec"] > 0
