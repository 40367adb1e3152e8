"""This process's device on torch (one per process), and its allocator's statistics."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any


def uses_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def device_name() -> str:
    """`"GPU:<i>"` (torch's current CUDA device: `LOCAL_RANK` in a job kmp joined), else
    `"CPU:0"`."""
    import torch

    return f"GPU:{torch.cuda.current_device()}" if uses_gpu() else "CPU:0"


def device_kind() -> str:
    import torch

    return torch.cuda.get_device_name() if uses_gpu() else "cpu"


def local_device_names() -> tuple[str, ...]:
    """The device this process trains on: in a job of several processes its own GPU
    (`GPU:LOCAL_RANK`), else every GPU torch sees (`GPU:0`, ...), or `("CPU:0",)`."""
    import torch

    if not uses_gpu():
        return ("CPU:0",)
    from keras_mgpu_plugins.backends.torch import collectives
    from keras_mgpu_plugins.cluster import world

    if collectives.initialized() or world.describes_a_job(os.environ):
        return (device_name(),)
    return tuple(f"GPU:{i}" for i in range(torch.cuda.device_count()))


def gpu_memory() -> Any:
    """This process's GPU and `torch.cuda`'s allocator statistics (`samplers.gpu.GPUMemory`):
    bytes allocated and their peak since `reset_peak` (`torch.cuda.reset_peak_memory_stats`)."""
    import torch

    from keras_mgpu_plugins.samplers.gpu import GPUDevice

    if not uses_gpu():
        return SimpleNamespace(devices=[], read=lambda name: None, reset_peak=lambda name: None)
    ordinal = torch.cuda.current_device()
    devices = [GPUDevice(name=f"GPU:{ordinal}", ordinal=ordinal, physical=f"cuda:{ordinal}",
                         framework="PyTorch", model=torch.cuda.get_device_name(ordinal))]

    def read(name: str) -> dict[str, int] | None:
        if name != devices[0].name:
            return None
        return {"current": int(torch.cuda.memory_allocated(ordinal)),
                "peak": int(torch.cuda.max_memory_allocated(ordinal))}

    def reset_peak(name: str) -> None:
        if name == devices[0].name:
            torch.cuda.reset_peak_memory_stats(ordinal)

    return SimpleNamespace(devices=devices, read=read, reset_peak=reset_peak)
