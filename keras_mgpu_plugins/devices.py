"""Logical devices: try multi-device code on one physical device (`kmp.simulate_devices`)."""

from __future__ import annotations

from keras_mgpu_plugins.errors import RuntimeAlreadyStartedError

__all__ = ["RuntimeAlreadyStartedError", "check_split", "simulate_devices"]


def simulate_devices(n: int, memory_limit_mb: int | None = None) -> list[str]:
    """Splits this process's device into `n` logical devices, on the active Keras backend.

    With a GPU, the first GPU is split into `n` logical GPUs of
    `memory_limit_mb` each (default: 1024) and the other GPUs are hidden, so
    the process sees exactly `n` devices; without one, the CPU is split into
    `n` logical CPUs. `@kmp.parallelize` then replicates over them, so
    multi-device code runs, and is tested, on a laptop. Call it first thing,
    before the backend runs any operation (TensorFlow: before any tensor,
    layer, model, tf.data pipeline or strategy; JAX: before any array).

    Args:
        n: Number of logical devices, at least 1.
        memory_limit_mb: Memory of each logical GPU. Ignored without a GPU.

    Returns:
        The names of the logical devices, e.g. `["/device:CPU:0", "/device:CPU:1"]`
        on TensorFlow.

    Raises:
        ValueError: If `n` is not a positive integer or `memory_limit_mb` not positive.
        RuntimeAlreadyStartedError: If the backend's runtime already started
            (a different split is asked for than the one in force).

    In a run of `kmp-verify` the run's own count is split instead of `n` (one device for
    its one-device runs), and nothing with processes (one device each).

    Example:
        >>> import keras_mgpu_plugins as kmp
        >>> kmp.simulate_devices(2)
        ['/device:CPU:0', '/device:CPU:1']
    """
    check_split(n, memory_limit_mb)
    from keras_mgpu_plugins import _backend
    from keras_mgpu_plugins.verify import _config as verify_run

    run = verify_run.current()  # a kmp-verify run splits as the run says, not as the script
    if run is not None and run.workers > 1:
        return list(_backend.active().local_device_names())  # a process per device
    if run is not None:
        n = run.devices
    return _backend.active().simulate_devices(n, memory_limit_mb)


def check_split(n: int, memory_limit_mb: int | None) -> None:
    """Raises `ValueError` unless `n` and `memory_limit_mb` are positive integers (or `None`)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer. Received: n={n!r}")
    if memory_limit_mb is not None and (isinstance(memory_limit_mb, bool)
                                        or not isinstance(memory_limit_mb, int)
                                        or memory_limit_mb <= 0):
        raise ValueError("memory_limit_mb must be a positive integer. Received: "
                         f"memory_limit_mb={memory_limit_mb!r}")
