"""The JAX lane on the real device: `@kmp.parallelize`, every callback, `DeviceMetricsLogger`
against `memory_stats()` and nvidia-smi, and `model_parallel`'s memory check against the
device's real `bytes_limit`.

On a GPU each test asserts what the GPU gives; in the GPU run's CPU dry run the same code
runs on the CPU and asserts what a CPU gives (no memory statistics, no NVML keys).
"""

from __future__ import annotations

import csv
import os

import jax
import keras
import numpy as np
import pytest
import smi
from models import Batches

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins import backends
from keras_mgpu_plugins.backends.jax import memory
from keras_mgpu_plugins.samplers.base import MB

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]
ROWS, BATCH, FEATURES = 512, 64, 32


def on_gpu(device) -> bool:
    return device.platform == "gpu"


def data(rows: int = ROWS, features: int = FEATURES, classes: int = 10):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features)).astype("float32")
    return x, rng.integers(0, classes, size=rows)


def classifier(optimizer="sgd", width: int = 256) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_parallelize_trains_on_the_device_as_plain_keras(device, record):
    x, y = data()
    before = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "highest")  # no TF32: within 1e-5
    try:
        model = kmp.parallelize(classifier)()
        held = {d for v in model.weights for d in v.value.devices()}
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        plain = classifier()
        plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    finally:
        jax.config.update("jax_default_matmul_precision", before)
    diff = max(float(np.max(np.abs(a - b)))
               for a, b in zip(model.get_weights(), plain.get_weights(), strict=True))
    record(devices=sorted(map(str, held)), weights_max_abs_diff=diff, loss=history.history["loss"])
    assert held == {device}
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert diff < 1e-5


def test_every_callback_on_the_device(device, record, tmp_path):
    x, y = data()
    model = kmp.parallelize(classifier)("adam")
    cb = kmp.callbacks
    verifier = cb.WeightSyncVerifier()
    callbacks = [
        cb.ModelCheckpoint(tmp_path / "best.keras", monitor="loss", save_best_only=True),
        cb.ParallelModelCheckpoint(model, str(tmp_path / "w-{epoch}.weights.h5"),
                                   monitor="loss", save_weights_only=True, async_save=True),
        cb.EarlyStopping(monitor="loss", patience=5),
        cb.BackupAndRestore(str(tmp_path / "backup"), async_save=True),
        cb.DeviceMetricsLogger(batch_size=BATCH, csv_path=str(tmp_path / "metrics.csv"),
                               summary=False, sample_interval=0.1),
        verifier,
        cb.StallWatchdog(timeout=120),
    ]
    history = model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                        callbacks=callbacks)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    device_keys = sorted(k for k in rows[-1] if k.startswith("device/"))
    record(epochs=history.epoch, files=sorted(os.listdir(tmp_path)), device_keys=device_keys,
           last_row={k: rows[-1][k] for k in device_keys})
    assert history.epoch == [0, 1, 2] and len(rows) == 3
    assert sorted(p.name for p in tmp_path.glob("w-*.weights.h5")) == [
        "w-1.weights.h5", "w-2.weights.h5", "w-3.weights.h5"]
    assert not (tmp_path / "backup").exists()  # deleted at the end of a finished fit
    best = int(np.argmin(history.history["loss"]))
    if best == 2:  # the last epoch's weights are the best: the file holds them
        loaded = keras.saving.load_model(tmp_path / "best.keras")
        np.testing.assert_allclose(loaded.predict(x[:64], verbose=0),
                                   model.predict(x[:64], verbose=0), atol=1e-5)
    assert verifier.last_report is not None and not verifier.last_report.mismatches
    if on_gpu(device):
        assert {"device/GPU:0/memory_mb", "device/GPU:0/peak_memory_mb"} <= set(device_keys)
    else:
        assert device_keys == []


def test_device_metrics_logger_agrees_with_memory_stats_and_nvidia_smi(device, record):
    gpu = on_gpu(device)
    width, batch, steps = (8192, 4096, 250) if gpu else (64, 32, 20)
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = kmp.parallelize(lambda: _busy(width))()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(4, batch, 1024)).astype("float32")
    model.fit(Batches(xs, xs, 3), epochs=1, verbose=0)  # compiles outside the measured fit
    logs: dict = {}
    keep = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, epoch_logs: logs.update(epoch_logs))
    logger = kmp.callbacks.DeviceMetricsLogger(batch_size=batch, summary=False, sample_interval=0.2)
    poller = smi.Poller(index=int(getattr(device, "local_hardware_id", 0) or 0), interval=0.2)
    poller.start()
    model.fit(Batches(xs, xs, steps), epochs=1, verbose=0, callbacks=[logger, keep])
    seen = poller.stop()
    stats = device.memory_stats()
    mine = {k: v for k, v in logs.items() if k.startswith(("device/", "throughput/"))}
    record(logger=mine, memory_stats=stats, nvidia_smi=seen, width=width, batch=batch, steps=steps)
    if not gpu:
        assert stats is None and not [k for k in mine if k.startswith("device/GPU")]
        return
    peak = mine["device/GPU:0/peak_memory_mb"] * MB
    assert 0.9 * stats["peak_bytes_in_use"] <= peak <= stats["peak_bytes_in_use"]
    assert mine["device/GPU:0/memory_mb"] * MB <= stats["bytes_limit"]
    if seen["readings"]:
        # JAX's pool is reserved from the driver: nvidia-smi sees at least what is in use
        assert seen["memory.used.max"] * 2**20 >= 0.99 * mine["device/GPU:0/memory_mb"] * MB
        util, smi_util = mine.get("device/GPU:0/utilization_pct"), seen["utilization.gpu"]
        assert util is not None and util > 30 and abs(util - smi_util) <= 20, (util, smi_util)
        power, smi_power = mine.get("device/GPU:0/power_w"), seen["power.draw"]
        assert power is not None and abs(power - smi_power) <= 0.25 * smi_power, (power, smi_power)


def _busy(width: int) -> keras.Model:
    model = keras.Sequential([keras.Input((1024,))]
                             + [keras.layers.Dense(width, activation="relu") for _ in range(4)]
                             + [keras.layers.Dense(1024)])
    model.compile(optimizer="adam", loss="mse")
    return model


def test_gpu_memory_reads_memory_stats(device, record):
    source = backends.current().gpu_memory()
    names = [d.name for d in source.devices]
    reading = source.read(names[0]) if names else None
    record(devices=[d._asdict() for d in source.devices], reading=reading,
           memory_stats=device.memory_stats())
    if not on_gpu(device):
        assert names == [] and device.memory_stats() is None
        return
    assert names[0] == "GPU:0" and reading["peak"] >= reading["current"] > 0


def test_model_parallel_memory_check_reads_the_real_bytes_limit(device, record):
    model = kmp.parallelize(strategy="model_parallel")(classifier)("adam")
    found = memory.needs(model)
    stats = device.memory_stats()
    params = sum(int(v.value.nbytes) for v in model.weights)
    record(needs=[vars(n) for n in found], memory_stats=stats, parameter_bytes=params)
    if not on_gpu(device):
        assert found == []
        return
    assert len(found) == 1 and found[0].limit_bytes == stats["bytes_limit"]
    assert found[0].parameter_bytes == params and found[0].fits
