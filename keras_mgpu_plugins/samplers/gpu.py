"""The real GPU sampler: TensorFlow's allocator, and NVML where it is installed.

- Memory in use and its peak come from `tf.config.experimental.get_memory_info`
  (bytes TensorFlow's allocator hands out, not the pool it reserved), and the
  peak restarts at `tf.config.experimental.reset_memory_stats`.
- Utilisation, power and temperature come from NVML (`pip install
  keras_mgpu_plugins[nvml]`, the `nvidia-ml-py` package), imported lazily.
  Without it, or without an NVIDIA driver, those fields are left out.

NVML numbers devices in PCI bus order and ignores `CUDA_VISIBLE_DEVICES`; CUDA
(and so TensorFlow) numbers the visible devices, fastest first unless
`CUDA_DEVICE_ORDER=PCI_BUS_ID`. TensorFlow's GPU `i` is mapped to NVML through
`CUDA_VISIBLE_DEVICES` (indices or UUIDs); when it goes by index and
`CUDA_DEVICE_ORDER` is not `PCI_BUS_ID`, a device whose NVML name differs from
TensorFlow's is not read from NVML (a warning says so).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

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


def logical_to_physical(tf: Any) -> list[tuple[int, Any]]:
    """For each logical GPU, its CUDA ordinal and physical device, in order."""
    mapping = []
    for physical in tf.config.get_visible_devices("GPU"):
        ordinal = int(physical.name.rpartition(":")[2])
        split = tf.config.get_logical_device_configuration(physical)
        mapping += [(ordinal, physical)] * (len(split) if split else 1)
    return mapping


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
        import tensorflow as tf

        self._tf = tf
        mapping = logical_to_physical(tf) if tf.config.list_physical_devices("GPU") else []
        self._devices = [f"GPU:{i}" for i in range(len(mapping))]
        self._handles: list[Any] = [None] * len(mapping)
        self._pynvml: Any = None
        self.nvml_error: str | None = None
        if mapping and use_nvml:
            self._open_nvml(mapping)

    def devices(self) -> list[str]:
        return list(self._devices)

    def sample(self) -> dict[str, dict[str, float]]:
        return {
            name: {**self._memory(name), **self._nvml(self._handles[i])}
            for i, name in enumerate(self._devices)
        }

    def reset_peaks(self) -> None:
        for name in self._devices:
            try:
                self._tf.config.experimental.reset_memory_stats(name)
            except (ValueError, RuntimeError, self._tf.errors.OpError):
                pass

    def close(self) -> None:
        """Releases NVML (reference counted by NVML itself)."""
        if self._pynvml is not None:
            try:
                self._pynvml.nvmlShutdown()
            except self._pynvml.NVMLError:
                pass
            self._pynvml = None

    def _memory(self, name: str) -> dict[str, float]:
        try:
            info = self._tf.config.experimental.get_memory_info(name)
        except (ValueError, RuntimeError, self._tf.errors.OpError):
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

    def _open_nvml(self, mapping: list[tuple[int, Any]]) -> None:
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
        targets = nvml_targets([o for o, _ in mapping], os.environ.get("CUDA_VISIBLE_DEVICES"))
        for i, ((_, physical), target) in enumerate(zip(mapping, targets, strict=True)):
            self._handles[i] = self._handle(pynvml, physical, target)

    def _handle(self, pynvml: Any, physical: Any, target: int | str) -> Any:
        try:
            if isinstance(target, int):
                handle = pynvml.nvmlDeviceGetHandleByIndex(target)
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(target)
            nvml_name = pynvml.nvmlDeviceGetName(handle)
        except pynvml.NVMLError as err:
            logger.warning("NVML has no device %r for %s (%s)", target, physical.name, err)
            return None
        if isinstance(target, str) or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
            return handle  # a UUID, or both number devices in PCI bus order
        tf_name = self._tf.config.experimental.get_device_details(physical).get("device_name")
        if tf_name and nvml_name and tf_name.strip().lower() != str(nvml_name).strip().lower():
            logger.warning(
                "NVML device %r is a %s but TensorFlow's %s is a %s; set "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID so both number GPUs alike. Utilisation, "
                "power and temperature are not reported for it.",
                target, nvml_name, physical.name, tf_name,
            )
            return None
        return handle
