"""The real GPU sampler: the backend's allocator, and NVML where it is installed.

- The GPUs, and memory in use and its peak, come from the active backend
  (`_backend.active().gpu_memory()`, a `GPUMemory`: `devices`, `read(name)` as
  `{"current", "peak"}` bytes, `reset_peak(name)`). On TensorFlow:
  `tf.config.experimental.get_memory_info` (bytes its allocator hands out, not
  the pool it reserved), the peak restarting at `reset_memory_stats`. On JAX:
  `Device.memory_stats()` (`bytes_in_use`, `peak_bytes_in_use`), whose peak
  never restarts.
- Utilisation, power and temperature come from NVML (`pip install
  keras_mgpu_plugins[nvml]`, the `nvidia-ml-py` package), imported lazily.
  Without it, or without an NVIDIA driver, those fields are left out.

NVML numbers devices in PCI bus order and ignores `CUDA_VISIBLE_DEVICES`; CUDA
(and so the backend) numbers the visible devices, fastest first unless
`CUDA_DEVICE_ORDER=PCI_BUS_ID`. The backend's GPU `i` is mapped to NVML through
`CUDA_VISIBLE_DEVICES` (indices or UUIDs); when it goes by index and
`CUDA_DEVICE_ORDER` is not `PCI_BUS_ID`, a device whose NVML name differs from
the backend's is not read from NVML (a warning says so).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, NamedTuple, Protocol

from keras_mgpu_plugins.samplers.base import MB

logger = logging.getLogger("keras_mgpu_plugins")

INSTALL_HINT = "pip install 'keras_mgpu_plugins[nvml]'"


def nvml_targets(ordinals: list[int], cuda_visible_devices: str | None) -> list[int | str]:
    """What NVML calls each CUDA device ordinal: an NVML index or a UUID.

    Args:
        ordinals: CUDA device ordinals (TensorFlow's physical GPU numbers).
        cuda_visible_devices: The `CUDA_VISIBLE_DEVICES` value, or `None`.

    Returns:
        One NVML index (int) or UUID (str) per ordinal.
    """
    if cuda_visible_devices is None or not cuda_visible_devices.strip():
        return list(ordinals)
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    targets: list[int | str] = []
    for ordinal in ordinals:
        entry = entries[ordinal] if ordinal < len(entries) else str(ordinal)
        targets.append(int(entry) if entry.isdigit() else entry)
    return targets


class GPUDevice(NamedTuple):
    """One GPU of this process, as a backend's `gpu_memory().devices` describes it.

    Attributes:
        name: Its name in readings, `"GPU:i"` (`i`: the backend's order).
        ordinal: Its CUDA device ordinal (several logical GPUs may share one).
        physical: The backend's name of the physical device, for messages.
        framework: Whose device it is, for messages (`"TensorFlow"`, `"JAX"`).
        model: The GPU's model as CUDA names it (`"NVIDIA H100 80GB HBM3"`), or
            `None`: compared with NVML's name when devices are mapped by index.
    """

    name: str
    ordinal: int
    physical: str
    framework: str
    model: str | None = None


class GPUMemory(Protocol):
    """A backend's GPUs and their allocators (`_backend.active().gpu_memory()`).

    The backend's framework is bound when it is made: reads import nothing.

    Attributes:
        devices: This process's GPUs, in the backend's order.
    """

    devices: list[GPUDevice]

    def read(self, name: str) -> dict[str, int] | None:
        """`{"current": bytes, "peak": bytes}` for device `name`, or `None` without a reading."""
        ...

    def reset_peak(self, name: str) -> None:
        """Restarts `name`'s peak at its current use, where the backend can."""
        ...


class GPUSampler:
    """Reads every logical GPU of this process (none on a machine without GPUs).

    Args:
        use_nvml: Read utilisation, power and temperature through NVML when
            `nvidia-ml-py` and a driver are present.

    Example:
        >>> sampler = GPUSampler()
        >>> sampler.devices()          # on a machine with 2 GPUs
        ['GPU:0', 'GPU:1']
        >>> sampler.sample()["GPU:0"]["memory_mb"]
        1532.4
    """

    def __init__(self, use_nvml: bool = True) -> None:
        from keras_mgpu_plugins import _backend

        self._source: GPUMemory = _backend.active().gpu_memory()
        gpus = list(self._source.devices)
        self._devices = [gpu.name for gpu in gpus]
        self._handles: list[Any] = [None] * len(gpus)
        self._pynvml: Any = None
        self.nvml_error: str | None = None
        if gpus and use_nvml:
            self._open_nvml(gpus)

    def devices(self) -> list[str]:
        return list(self._devices)

    def sample(self) -> dict[str, dict[str, float]]:
        return {
            name: {**self._memory(name), **self._nvml(self._handles[i])}
            for i, name in enumerate(self._devices)
        }

    def reset_peaks(self) -> None:
        for name in self._devices:
            self._source.reset_peak(name)

    def close(self) -> None:
        """Releases NVML (reference counted by NVML itself)."""
        if self._pynvml is not None:
            try:
                self._pynvml.nvmlShutdown()
            except self._pynvml.NVMLError:
                pass
            self._pynvml = None

    def _memory(self, name: str) -> dict[str, float]:
        info = self._source.read(name)  # None: the backend has no reading
        if info is None:
            return {}
        return {"memory_mb": info["current"] / MB, "peak_memory_mb": info["peak"] / MB}

    def _nvml(self, handle: Any) -> dict[str, float]:
        if handle is None:
            return {}
        nvml, out = self._pynvml, {}
        reads = {
            "utilization_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(
                handle, nvml.NVML_TEMPERATURE_GPU
            ),
        }
        for field, read in reads.items():
            try:
                out[field] = float(read())
            except nvml.NVMLError:  # e.g. not supported on this GPU or MIG slice
                out[field] = math.nan
        return out

    def _open_nvml(self, gpus: list[GPUDevice]) -> None:
        try:
            import pynvml
        except ImportError:
            self.nvml_error = f"nvidia-ml-py is not installed ({INSTALL_HINT})"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            self.nvml_error = f"NVML could not start ({err})"
            return
        self._pynvml = pynvml
        targets = nvml_targets([g.ordinal for g in gpus], os.environ.get("CUDA_VISIBLE_DEVICES"))
        for i, (gpu, target) in enumerate(zip(gpus, targets, strict=True)):
            self._handles[i] = self._handle(pynvml, gpu, target)

    def _handle(self, pynvml: Any, gpu: GPUDevice, target: int | str) -> Any:
        try:
            if isinstance(target, int):
                handle = pynvml.nvmlDeviceGetHandleByIndex(target)
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(target)
            nvml_name = pynvml.nvmlDeviceGetName(handle)
        except pynvml.NVMLError as err:
            logger.warning("NVML has no device %r for %s (%s)", target, gpu.physical, err)
            return None
        if isinstance(target, str) or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
            return handle  # a UUID, or both number devices in PCI bus order
        model = gpu.model
        if model and nvml_name and model.strip().lower() != str(nvml_name).strip().lower():
            logger.warning(
                "NVML device %r is a %s but %s's %s is a %s; set "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID so both number GPUs alike. Utilisation, "
                "power and temperature are not reported for it.",
                target, nvml_name, gpu.framework, gpu.physical, model,
            )
            return None
        return handle
