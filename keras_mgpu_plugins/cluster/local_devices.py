"""This process's devices as the environment names them, before any backend starts."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: The backends' modules whose import means devices may be configured in-process.
_BACKEND_MODULES = ("tensorflow", "jax")


def local_device_names() -> tuple[str, ...]:
    """This process's GPUs, else its (logical) CPUs, without starting a backend's runtime.

    Before a backend is imported (importing one costs seconds) the environment
    answers where it can, and then no logical devices can be configured yet:
    `CUDA_VISIBLE_DEVICES` gives `GPU:0..n-1` (or `CPU:0` when it hides every
    GPU), and a Linux machine with no GPU driver (no `/proc/driver/nvidia/gpus`,
    `/dev/nvidia<N>` or `/dev/kfd`) gives `CPU:0`. Otherwise, or once a backend
    is imported, the active Keras backend's visible and logical devices answer.
    """
    if not any(name in sys.modules for name in _BACKEND_MODULES):
        gpus = gpus_from_env(os.environ, _has_gpu_driver())
        if gpus is not None:
            return tuple(f"GPU:{i}" for i in range(gpus)) or ("CPU:0",)
    from keras_mgpu_plugins import _backend

    return _backend.active().local_device_names()


def gpus_from_env(env: Mapping[str, str], driver: bool | None) -> int | None:
    """How many GPUs the environment alone gives this process, or `None` if it cannot say.

    Args:
        env: Environment variables.
        driver: Whether the machine has a GPU driver (`None`: unknown).

    Returns:
        0 without a driver; else the GPUs `CUDA_VISIBLE_DEVICES` lists (CUDA
        stops at the first `-1` or empty entry); `None` when it is unset.
    """
    if driver is False:
        return 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    count = 0
    for entry in visible.split(","):
        if entry.strip() in ("", "-1"):
            break
        count += 1
    return count


def _has_gpu_driver() -> bool | None:
    """Whether a GPU driver is present (Linux: NVIDIA or ROCm devices); `None` elsewhere."""
    import glob

    if not sys.platform.startswith("linux"):
        return None
    return bool(os.path.isdir("/proc/driver/nvidia/gpus") or glob.glob("/dev/nvidia[0-9]*")
                or os.path.exists("/dev/kfd"))


def gpus_on_driver() -> int | None:
    """How many GPUs the driver shows (`/proc/driver/nvidia/gpus/*`, else `/dev/nvidia<N>`),
    all of them visible where `CUDA_VISIBLE_DEVICES` is unset; `None` where it cannot say."""
    import glob

    if not sys.platform.startswith("linux"):
        return None
    found = glob.glob("/proc/driver/nvidia/gpus/*") or glob.glob("/dev/nvidia[0-9]*")
    return len(found) or None
