"""The ceilings of this run, measured first: the bf16 matrix product rate and device-to-device
copy bandwidth (what model FLOPs utilisation and the fingerprint's throughput are compared
with), and what the device is: JAX's devices and memory statistics, nvidia-smi, NVML."""

from __future__ import annotations

import os

import common
import smi

SIZES = {
    "gpu": {"matmul_n": 8192, "copy_bytes": 4 << 30, "repeats": 10},
    "cpu": {"matmul_n": 256, "copy_bytes": 4 << 20, "repeats": 3},
}
ENV = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
       "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_FLAGS", "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES")


def run(rec: common.Recorder, size: dict) -> None:
    with rec.step("planned_devices"):  # before JAX starts: what kmp.topology() would name
        from keras_mgpu_plugins.backends.jax.devices import planned_device_names
        from keras_mgpu_plugins.cluster.local_devices import _has_gpu_driver

        rec.put(planned_devices=list(planned_device_names()), gpu_driver=_has_gpu_driver())
    with rec.step("devices"):
        import jax

        rec.put(environment={name: os.environ.get(name) for name in ENV},
                jax_backend=jax.default_backend(),
                devices=[{"id": d.id, "platform": d.platform, "kind": d.device_kind,
                          "memory_stats": d.memory_stats()} for d in jax.devices()])
    with rec.step("nvidia-smi"):
        rec.put(nvidia_smi=smi.query() or "nvidia-smi not found")
    with rec.step("nvml"):
        rec.put(nvml=nvml())
    with rec.step("bf16_matmul"):
        found = common.bf16_matmul_tflops(size["matmul_n"], size["repeats"])
        rec.put(bf16_matmul=found, bf16_matmul_tflops=found["tflops"])
    with rec.step("device_copy"):
        found = common.device_copy_gbps(size["copy_bytes"], size["repeats"])
        rec.put(device_copy=found, device_copy_gbps=found["device_put_gbps"]
                or found["elementwise_gbps"])
    with rec.step("nvidia-smi after"):  # clocks and power right after the products
        rec.put(nvidia_smi_after=smi.query() or "nvidia-smi not found")


def nvml() -> dict | str:
    """Name, memory, utilisation and power of GPU 0 through NVML (nvidia-ml-py), as
    DeviceMetricsLogger reads them."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return f"NVML could not start: {err}"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {"name": str(pynvml.nvmlDeviceGetName(handle)),
                "driver": str(pynvml.nvmlSystemGetDriverVersion()),
                "memory_total": int(memory.total), "memory_used": int(memory.used),
                "utilization_pct": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000}
    finally:
        pynvml.nvmlShutdown()
