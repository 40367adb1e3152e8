"""This process's device on torch, and DeviceMetricsLogger's readings of it: `torch.cuda`'s
allocator statistics on a GPU (faked here: the CPU machine has none; the GPU test machine
runs the real ones), host metrics only on the CPU."""

from __future__ import annotations

import types

import numpy as np

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.backends.torch import devices


def fake_cuda(monkeypatch, allocated=(100, 300)):
    import torch

    state = {"current": allocated[0], "peak": allocated[1], "resets": 0}

    def reset(ordinal):
        state["resets"] += 1
        state["peak"] = state["current"]

    fake = types.SimpleNamespace(
        is_available=lambda: True, current_device=lambda: 1, device_count=lambda: 2,
        get_device_name=lambda ordinal=None: "NVIDIA H200",
        memory_allocated=lambda ordinal: state["current"],
        max_memory_allocated=lambda ordinal: state["peak"], reset_peak_memory_stats=reset)
    monkeypatch.setattr(torch, "cuda", fake)
    return state


def test_a_gpu_process_reads_torch_cuda_allocator_statistics(monkeypatch):
    state = fake_cuda(monkeypatch)
    memory = devices.gpu_memory()
    (gpu,) = memory.devices
    assert (gpu.name, gpu.ordinal, gpu.framework, gpu.model) == ("GPU:1", 1, "PyTorch",
                                                                  "NVIDIA H200")
    assert memory.read("GPU:1") == {"current": 100, "peak": 300}
    assert memory.read("GPU:0") is None
    memory.reset_peak("GPU:1")
    assert state["resets"] == 1 and memory.read("GPU:1")["peak"] == 100
    assert devices.device_name() == "GPU:1"


def test_in_a_job_a_process_names_its_own_gpu_only(monkeypatch):
    fake_cuda(monkeypatch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert devices.local_device_names() == ("GPU:0", "GPU:1")  # one process sees both
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert devices.local_device_names() == ("GPU:1",)  # torchrun: LOCAL_RANK's device


def test_on_cpu_device_metrics_are_the_hosts(tmp_path):
    import keras

    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    logger = kmp.callbacks.DeviceMetricsLogger(batch_size=8, sample_interval=None,
                                               summary=False)
    history = model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[logger])
    keys = set(history.history)
    assert {"host/memory_mb", "step_time/mean_ms", "throughput/samples_per_sec"} <= keys
    assert not [k for k in keys if k.startswith("gpu")]
