"""This process's devices, named without starting TensorFlow's runtime."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def local_device_names() -> tuple[str, ...]:
    """This process's GPUs, else its (logical) CPUs, without starting TF's runtime.

    Before TensorFlow is imported (importing it costs seconds) the environment
    answers where it can, and then no logical devices can be configured yet:
    `CUDA_VISIBLE_DEVICES` gives `GPU:0..n-1` (or `CPU:0` when it hides every
    GPU), and a Linux machine with no GPU driver (no `/proc/driver/nvidia/gpus`,
    `/dev/nvidia<N>` or `/dev/kfd`) gives `CPU:0`. Otherwise, or once TensorFlow
    is imported, TensorFlow's visible and logical devices answer.
    """
    import sys

    if "tensorflow" not in sys.modules:
        gpus = gpus_from_env(os.environ, _has_gpu_driver())
        if gpus is not None:
            return tuple(f"GPU:{i}" for i in range(gpus)) or ("CPU:0",)
    import tensorflow as tf

    gpus = tf.config.get_visible_devices("GPU")  # simulate_devices hides all GPUs but one
    if gpus:
        logical = _logical_count(tf, gpus)
        return tuple(f"GPU:{i}" for i in range(logical))
    cpus = tf.config.list_physical_devices("CPU")
    return tuple(f"CPU:{i}" for i in range(_logical_count(tf, cpus[:1])))


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
    import sys

    if not sys.platform.startswith("linux"):
        return None
    return bool(os.path.isdir("/proc/driver/nvidia/gpus") or glob.glob("/dev/nvidia[0-9]*")
                or os.path.exists("/dev/kfd"))


def _logical_count(tf: Any, physical: list) -> int:
    count = 0
    for device in physical:
        configured = tf.config.get_logical_device_configuration(device)
        count += len(configured) if configured else 1
    return count
