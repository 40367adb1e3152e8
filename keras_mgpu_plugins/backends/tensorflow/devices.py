"""Logical devices: try multi-device code on one physical device."""

from __future__ import annotations

from keras_mgpu_plugins.devices import check_split
from keras_mgpu_plugins.errors import RuntimeAlreadyStartedError


def simulate_devices(n: int, memory_limit_mb: int | None = None) -> list[str]:
    """`kmp.simulate_devices` on TensorFlow: `n` logical devices, the runtime not started.

    With a GPU, the first GPU is split into `n` logical GPUs of `memory_limit_mb`
    each (default: 1024) and the other GPUs are hidden; without one, the CPU is
    split. It does not start TensorFlow's runtime: what must come before it (a
    multi-worker strategy, memory growth) may still follow, and a second call
    before the runtime starts replaces the split.

    Returns:
        The names of the logical devices, e.g. `["/device:CPU:0", "/device:CPU:1"]`.

    Raises:
        RuntimeAlreadyStartedError: If TensorFlow's runtime already started
            (a different split is asked for than the one in force).
    """
    check_split(n, memory_limit_mb)
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    kind = "GPU" if gpus else "CPU"
    physical = gpus[0] if gpus else tf.config.list_physical_devices("CPU")[0]
    if gpus:
        configs = [
            tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mb or 1024)
            for _ in range(n)
        ]
    else:
        configs = [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    current = tf.config.get_logical_device_configuration(physical)
    try:
        if len(gpus) > 1:
            tf.config.set_visible_devices(gpus[:1], "GPU")
        tf.config.set_logical_device_configuration(physical, configs)
    except RuntimeError as err:
        visible = tf.config.get_visible_devices(kind)
        if current is not None and len(current) == n and visible == [physical]:
            return _names(kind, n)  # already split this way: nothing to do
        raise RuntimeAlreadyStartedError(
            f"simulate_devices({n}) must run before TensorFlow starts its runtime "
            f"(TensorFlow said: {err}). Call it at the top of your script, before any "
            "tensor, layer, model, tf.data pipeline or strategy is created."
        ) from None
    return _names(kind, n)


def _names(kind: str, n: int) -> list[str]:
    """The logical devices' names, as TensorFlow will list them (listing would start it)."""
    return [f"/device:{kind}:{i}" for i in range(n)]
