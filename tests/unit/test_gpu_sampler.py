"""`GPUSampler` on a machine without a GPU: through fakes of exactly what it calls.

`fake_tensorflow` stands in for the parts of TensorFlow the sampler uses
(`tf.config.list_physical_devices`, `get_visible_devices`,
`get_logical_device_configuration`, `experimental.get_memory_info`,
`reset_memory_stats`, `get_device_details`, `tf.errors.OpError`); `fake_pynvml`
for nvidia-ml-py's `pynvml` (`nvmlInit`, `nvmlShutdown`,
`nvmlDeviceGetHandleByIndex` / `ByUUID`, `nvmlDeviceGetName`,
`nvmlDeviceGetUtilizationRates(h).gpu`, `nvmlDeviceGetPowerUsage` in mW,
`nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)`, `NVMLError`). Both are
put in `sys.modules`, where the sampler's lazy `import` statements find them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import types

import pytest

from keras_mgpu_plugins.samplers import DeviceSampler, GPUSampler
from keras_mgpu_plugins.samplers.gpu import INSTALL_HINT

MIB = 1 << 20
H100 = "NVIDIA H100 80GB HBM3"


class FakeNVMLError(Exception):
    pass


class FakeOpError(Exception):
    pass


def fake_tensorflow(split, memory, names=None):
    """TensorFlow with `len(split)` visible GPUs, physical GPU `i` split into `split[i]` logical ones.

    Args:
        split: Logical GPUs per physical GPU (1: not split).
        memory: Logical name → `(current, peak)` in bytes; a name left out raises ValueError.
        names: Physical GPU index → TensorFlow's device name (default: an H100).
    """
    physical = [types.SimpleNamespace(name=f"/physical_device:GPU:{i}", device_type="GPU")
                for i in range(len(split))]
    tf = types.SimpleNamespace(resets=[])

    def get_memory_info(device):
        if device not in memory:
            raise ValueError(f"No such device: {device}")
        current, peak = memory[device]
        return {"current": current, "peak": peak}

    def reset_memory_stats(device):
        tf.resets.append(device)
        if device not in memory:
            raise ValueError(f"No such device: {device}")

    tf.config = types.SimpleNamespace(
        list_physical_devices=lambda kind=None: list(physical) if kind == "GPU" else [],
        get_visible_devices=lambda kind=None: list(physical) if kind == "GPU" else [],
        get_logical_device_configuration=lambda device: (
            [object()] * split[physical.index(device)] if split[physical.index(device)] > 1 else None),
        experimental=types.SimpleNamespace(
            get_memory_info=get_memory_info,
            reset_memory_stats=reset_memory_stats,
            get_device_details=lambda device: {
                "device_name": (names or {}).get(physical.index(device), H100)},
        ),
    )
    tf.errors = types.SimpleNamespace(OpError=FakeOpError)
    return tf


def fake_pynvml(devices, names=None, fail=(), init_error=None):
    """pynvml whose devices (NVML index or UUID → (utilisation %, power mW, temperature °C)) read fixed numbers.

    Args:
        devices: What each NVML index (int) or UUID (str) reads.
        names: NVML index or UUID → NVML's device name (default: an H100).
        fail: `(device, reading)` pairs that raise `NVMLError`, reading one of
            `"utilization"`, `"power"`, `"temperature"`.
        init_error: Message of an `NVMLError` raised by `nvmlInit`.
    """
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = FakeNVMLError
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.calls = []

    def init():
        nvml.calls.append(("nvmlInit",))
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def handle(how, key):
        nvml.calls.append((how, key))
        if key not in devices:
            raise FakeNVMLError("Invalid Argument")
        return ("handle", key)

    def read(kind, h):
        if (h[1], kind) in fail:
            raise FakeNVMLError("Not Supported")
        return devices[h[1]][("utilization", "power", "temperature").index(kind)]

    def temperature(h, sensor):
        assert sensor == nvml.NVML_TEMPERATURE_GPU
        return read("temperature", h)

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: nvml.calls.append(("nvmlShutdown",))
    nvml.nvmlDeviceGetHandleByIndex = lambda index: handle("ByIndex", index)
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: handle("ByUUID", uuid)
    nvml.nvmlDeviceGetName = lambda h: (names or {}).get(h[1], H100)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=read("utilization", h), memory=3)
    nvml.nvmlDeviceGetPowerUsage = lambda h: read("power", h)
    nvml.nvmlDeviceGetTemperature = temperature
    return nvml


@contextlib.contextmanager
def fake_gpu_machine(monkeypatch, tf, nvml, visible=None, order=None):
    """`tensorflow` and `pynvml` replaced (`nvml=None`: not installed) while the block runs."""
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "tensorflow", tf)
        patch.setitem(sys.modules, "pynvml", nvml)  # None: `import pynvml` raises ImportError
        for name, value in (("CUDA_VISIBLE_DEVICES", visible), ("CUDA_DEVICE_ORDER", order)):
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        yield


def memory_of(*mib):
    """`GPU:i` holds `mib[i]` MiB, its peak twice that."""
    return {f"GPU:{i}": (m * MIB, 2 * m * MIB) for i, m in enumerate(mib)}


def test_units_and_mapping_through_cuda_visible_devices_with_a_split_gpu(monkeypatch):
    # CUDA sees NVML's GPUs 3 and 1 as its 0 and 1; TensorFlow splits the second in two
    tf = fake_tensorflow([1, 2], {"GPU:0": (512 * MIB, 3 * MIB // 2 * 1024), "GPU:1": (MIB // 4, MIB),
                                  "GPU:2": (0, 3 * MIB)})
    nvml = fake_pynvml({3: (75, 250_500, 61), 1: (20, 90_000, 45), 0: (99, 1, 99)})
    with fake_gpu_machine(monkeypatch, tf, nvml, visible="3,1"):
        sampler = GPUSampler()
        assert isinstance(sampler, DeviceSampler)
        assert sampler.devices() == ["GPU:0", "GPU:1", "GPU:2"] and sampler.nvml_error is None
        assert sampler.sample() == {
            "GPU:0": {"memory_mb": 512.0, "peak_memory_mb": 1536.0,  # bytes → MiB
                      "utilization_pct": 75.0, "power_w": 250.5, "temperature_c": 61.0},  # mW → W
            "GPU:1": {"memory_mb": 0.25, "peak_memory_mb": 1.0,
                      "utilization_pct": 20.0, "power_w": 90.0, "temperature_c": 45.0},
            "GPU:2": {"memory_mb": 0.0, "peak_memory_mb": 3.0,  # the same physical GPU's NVML numbers
                      "utilization_pct": 20.0, "power_w": 90.0, "temperature_c": 45.0},
        }
    assert nvml.calls == [("nvmlInit",), ("ByIndex", 3), ("ByIndex", 1), ("ByIndex", 1)]


def test_uuids_in_cuda_visible_devices_are_opened_by_uuid_without_a_name_check(monkeypatch):
    tf = fake_tensorflow([1, 1], memory_of(10, 20))
    nvml = fake_pynvml({"GPU-bbbb": (5, 1_000, 30), "GPU-aaaa": (6, 2_000, 31)},
                       names={"GPU-bbbb": "Tesla T4"})  # names differ: a UUID is unambiguous
    with fake_gpu_machine(monkeypatch, tf, nvml, visible="GPU-bbbb, GPU-aaaa"):
        readings = GPUSampler().sample()
    assert nvml.calls[1:] == [("ByUUID", "GPU-bbbb"), ("ByUUID", "GPU-aaaa")]
    assert [readings[d]["power_w"] for d in ("GPU:0", "GPU:1")] == [1.0, 2.0]
    assert readings["GPU:0"]["memory_mb"] == 10.0 and readings["GPU:1"]["peak_memory_mb"] == 40.0


@pytest.mark.parametrize("order, read_gpu0", [(None, False), ("PCI_BUS_ID", True)])
def test_index_mapping_skips_a_gpu_whose_nvml_name_differs_unless_in_pci_bus_order(
        monkeypatch, caplog, order, read_gpu0):
    tf = fake_tensorflow([1, 1], memory_of(10, 20))
    nvml = fake_pynvml({0: (5, 1_000, 30), 1: (6, 2_000, 31)}, names={0: "Tesla T4"})
    with fake_gpu_machine(monkeypatch, tf, nvml, order=order), \
            caplog.at_level(logging.WARNING, logger="keras_mgpu_plugins"):
        readings = GPUSampler().sample()
    assert readings["GPU:1"] == {"memory_mb": 20.0, "peak_memory_mb": 40.0,
                                 "utilization_pct": 6.0, "power_w": 2.0, "temperature_c": 31.0}
    if read_gpu0:
        assert readings["GPU:0"]["utilization_pct"] == 5.0 and caplog.records == []
    else:
        assert readings["GPU:0"] == {"memory_mb": 10.0, "peak_memory_mb": 20.0}  # memory only
        assert [r.getMessage() for r in caplog.records] == [
            f"NVML device 0 is a Tesla T4 but TensorFlow's /physical_device:GPU:0 is a {H100}; set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID so both number GPUs alike. Utilisation, power and "
            "temperature are not reported for it."]


def test_a_gpu_nvml_does_not_know_reads_memory_only_with_a_warning(monkeypatch, caplog):
    tf = fake_tensorflow([1, 1], memory_of(10, 20))
    nvml = fake_pynvml({0: (5, 1_000, 30)})
    with fake_gpu_machine(monkeypatch, tf, nvml), caplog.at_level(logging.WARNING, logger="keras_mgpu_plugins"):
        readings = GPUSampler().sample()
    assert readings["GPU:0"]["power_w"] == 1.0
    assert readings["GPU:1"] == {"memory_mb": 20.0, "peak_memory_mb": 40.0}
    assert [r.getMessage() for r in caplog.records] == [
        "NVML has no device 1 for /physical_device:GPU:1 (Invalid Argument)"]


def test_an_nvml_error_on_one_reading_is_nan_for_that_field_only(monkeypatch):
    tf = fake_tensorflow([1, 1], memory_of(10, 20))
    nvml = fake_pynvml({0: (5, 1_000, 30), 1: (6, 2_000, 31)}, fail={(0, "power"), (1, "temperature")})
    with fake_gpu_machine(monkeypatch, tf, nvml):
        readings = GPUSampler().sample()
    gpu0, gpu1 = readings["GPU:0"], readings["GPU:1"]
    assert math.isnan(gpu0.pop("power_w")) and math.isnan(gpu1.pop("temperature_c"))
    assert gpu0 == {"memory_mb": 10.0, "peak_memory_mb": 20.0, "utilization_pct": 5.0, "temperature_c": 30.0}
    assert gpu1 == {"memory_mb": 20.0, "peak_memory_mb": 40.0, "utilization_pct": 6.0, "power_w": 2.0}


def test_a_memory_reading_tensorflow_refuses_leaves_out_that_devices_memory(monkeypatch):
    tf = fake_tensorflow([1, 1], {"GPU:1": (MIB, MIB)})  # GPU:0 raises ValueError
    nvml = fake_pynvml({0: (5, 1_000, 30), 1: (6, 2_000, 31)})
    with fake_gpu_machine(monkeypatch, tf, nvml):
        readings = GPUSampler().sample()
    assert readings["GPU:0"] == {"utilization_pct": 5.0, "power_w": 1.0, "temperature_c": 30.0}
    assert readings["GPU:1"]["memory_mb"] == 1.0


@pytest.mark.parametrize(
    "nvml, message",
    [
        (None, f"nvidia-ml-py is not installed ({INSTALL_HINT})"),
        (fake_pynvml({}, init_error="Driver Not Loaded"), "NVML could not start (Driver Not Loaded)"),
    ],
    ids=["not-installed", "init-fails"],
)
def test_without_nvml_memory_keys_only_and_the_reason(monkeypatch, nvml, message):
    tf = fake_tensorflow([1, 1], memory_of(10, 20))
    with fake_gpu_machine(monkeypatch, tf, nvml):
        sampler = GPUSampler()
        assert sampler.nvml_error == message
        assert sampler.sample() == {"GPU:0": {"memory_mb": 10.0, "peak_memory_mb": 20.0},
                                    "GPU:1": {"memory_mb": 20.0, "peak_memory_mb": 40.0}}
        sampler.close()  # nothing to shut down
    if nvml is not None:
        assert nvml.calls == [("nvmlInit",)]


def test_reset_peaks_resets_every_logical_gpu_and_survives_a_refusal(monkeypatch):
    tf = fake_tensorflow([2, 1], {"GPU:0": (0, 0), "GPU:2": (0, 0)})  # GPU:1 raises ValueError
    with fake_gpu_machine(monkeypatch, tf, fake_pynvml({})):
        sampler = GPUSampler(use_nvml=False)
        sampler.reset_peaks()
    assert tf.resets == ["GPU:0", "GPU:1", "GPU:2"]


def test_nvml_is_left_alone_without_gpus_or_when_not_wanted_and_shut_down_once(monkeypatch):
    nvml = fake_pynvml({0: (5, 1_000, 30)})
    with fake_gpu_machine(monkeypatch, fake_tensorflow([], {}), nvml):
        assert GPUSampler().sample() == {}
    with fake_gpu_machine(monkeypatch, fake_tensorflow([1], memory_of(10)), nvml):
        assert GPUSampler(use_nvml=False).sample() == {"GPU:0": {"memory_mb": 10.0, "peak_memory_mb": 20.0}}
        assert nvml.calls == []
        sampler = GPUSampler()
        sampler.close()
        sampler.close()
    assert nvml.calls == [("nvmlInit",), ("ByIndex", 0), ("nvmlShutdown",)]
