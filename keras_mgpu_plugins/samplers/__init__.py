"""Device samplers: where `kmp.callbacks.DeviceMetricsLogger` gets its readings.

The GPU code paths sit behind one small interface, `DeviceSampler`
(`devices()`, `sample()`, `reset_peaks()`), so everything that turns readings
into logs, files and plots runs the same with real GPUs (`GPUSampler`, the
default) and with scripted numbers (`ScriptedSampler`) on a machine without one.

- `GPUSampler`: the backend's allocator (memory in use, peak; `_backend.active()`) and NVML
  (utilisation, power, temperature) when `nvidia-ml-py` is installed.
- `HostSampler`: this process's memory and CPU use (psutil).
- `ScriptedSampler`: replays given readings, for tests and demos.
- `SamplerThread`: reads at a fixed interval off the training thread.
"""

from __future__ import annotations

from keras_mgpu_plugins.samplers.base import DEVICE_FIELDS, HOST_FIELDS, DeviceSampler
from keras_mgpu_plugins.samplers.gpu import GPUSampler
from keras_mgpu_plugins.samplers.host import HostSampler
from keras_mgpu_plugins.samplers.scripted import ScriptedSampler
from keras_mgpu_plugins.samplers.thread import SamplerThread

__all__ = [
    "DEVICE_FIELDS",
    "HOST_FIELDS",
    "DeviceSampler",
    "GPUSampler",
    "HostSampler",
    "SamplerThread",
    "ScriptedSampler",
]
