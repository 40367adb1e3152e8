"""`simulate_devices` on JAX: n CPU devices in this process, set before JAX's backend starts."""

from __future__ import annotations

import os
import re
import sys

from keras_mgpu_plugins.devices import check_split
from keras_mgpu_plugins.errors import RuntimeAlreadyStartedError

#: The XLA flag that splits the host into n CPU devices (read when JAX's CPU backend starts).
XLA_COUNT_FLAG = "--xla_force_host_platform_device_count"


def simulate_devices(n: int, memory_limit_mb: int | None = None) -> list[str]:
    """Gives this process `n` CPU devices, so multi-device JAX code runs on one machine.

    Sets JAX's CPU device count (`jax_num_cpu_devices`, and for processes this
    one starts, `JAX_NUM_CPU_DEVICES` and `XLA_FLAGS=--xla_force_host_platform_device_count`).
    Unless `JAX_PLATFORMS` is set, JAX's platform is set to `"cpu"`, so the process
    sees exactly `n` devices even where a GPU is present (as on TensorFlow, where the
    first GPU is split). `keras.distribution.DataParallel` (and `kmp.parallelize`) then
    replicates over them. Call it first thing: before any JAX array, layer or model is
    created and before `jax.distributed` is initialised. It does not start JAX's
    backend itself; a second call before the backend starts replaces the count.

    Args:
        n: Number of CPU devices, at least 1.
        memory_limit_mb: Accepted for the TensorFlow signature, and checked to be
            positive; JAX's CPU devices share the host's memory, so it limits nothing.

    Returns:
        The devices' names, `["cpu:0", ..., f"cpu:{n - 1}"]` (JAX's names in a
        single process; listing them would start the backend).

    Raises:
        ValueError: If `n` is not a positive integer, or `memory_limit_mb` not positive.
        RuntimeAlreadyStartedError: If JAX's backend already started with another
            number of CPU devices (naming both).

    Example:
        >>> import keras_mgpu_plugins as kmp
        >>> kmp.simulate_devices(2)
        ['cpu:0', 'cpu:1']
    """
    check_split(n, memory_limit_mb)
    _set_environment(n)
    if "jax" in sys.modules:  # imported (Keras imports it): the environment was read already
        _set_config(n)
    return [f"cpu:{i}" for i in range(n)]


def _set_environment(n: int) -> None:
    """What a JAX imported later (here or in a child process) reads at start."""
    os.environ["JAX_NUM_CPU_DEVICES"] = str(n)
    flags = re.sub(rf"{XLA_COUNT_FLAG}=\S*", "", os.environ.get("XLA_FLAGS", "")).split()
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{XLA_COUNT_FLAG}={n}"])
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _set_config(n: int) -> None:
    import jax

    try:
        if not os.environ.get("JAX_PLATFORMS") and jax.config.jax_platforms in (None, ""):
            jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as err:  # "should be updated before backends are initialized"
        in_force = len(jax.local_devices(backend="cpu"))  # this process's, not the job's
        if in_force == n and jax.default_backend() == "cpu":
            return
        raise RuntimeAlreadyStartedError(
            f"simulate_devices({n}) must run before JAX starts its backend, which already runs "
            f"with {in_force} CPU device(s) (default backend: {jax.default_backend()}; JAX said: "
            f"{err}). Call it first thing in your script, before any JAX array, Keras layer or "
            "model is created and before jax.distributed / keras.distribution.initialize."
        ) from None


def planned_device_names() -> tuple[str, ...]:
    """The devices JAX will start with, named without starting it.

    CPU only (`JAX_PLATFORMS` / `jax_platforms` is `"cpu"`, as `simulate_devices` sets it,
    or no GPU the environment can see): `jax_num_cpu_devices` CPUs. Otherwise the GPUs
    the environment gives this process: `CUDA_VISIBLE_DEVICES`, or, where it is unset and
    JAX's CUDA/ROCm plugin is installed, every GPU the driver shows.
    """
    import jax

    from keras_mgpu_plugins.cluster.local_devices import (
        _has_gpu_driver,
        gpus_from_env,
        gpus_on_driver,
    )

    platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or ""
    cpus = max(1, int(jax.config.jax_num_cpu_devices or 0))
    if platforms.split(",")[0].strip() != "cpu":
        driver = _has_gpu_driver()
        gpus = gpus_from_env(os.environ, driver)
        if gpus is None and driver and _jax_gpu_plugin():  # every GPU the driver shows
            gpus = gpus_on_driver()
        if gpus:
            return tuple(f"GPU:{i}" for i in range(gpus))
    return tuple(f"CPU:{i}" for i in range(cpus))


def _jax_gpu_plugin() -> bool:
    """Whether JAX's CUDA or ROCm plugin is installed (without it JAX starts on the CPU)."""
    import importlib.metadata

    names = (str(d.metadata["Name"] or "").lower().replace("_", "-")
             for d in importlib.metadata.distributions())
    return any(n.startswith(("jax-cuda", "jax-rocm")) for n in names)
