"""TensorFlow's view of this process's GPUs: which logical GPU is which CUDA device, and
what its allocator holds (`samplers.GPUSampler` reads them through `backends.current()`).

- Memory in use and its peak come from `tf.config.experimental.get_memory_info`
  (bytes TensorFlow's allocator hands out, not the pool it reserved), and the
  peak restarts at `tf.config.experimental.reset_memory_stats`.
- A physical GPU split into several logical ones (`kmp.simulate_devices`) gives
  each of them the same CUDA ordinal.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.samplers.gpu import GPUDevice


class TensorFlowGPUMemory:
    """`samplers.gpu.GPUMemory` on TensorFlow: its logical GPUs and their allocators.

    TensorFlow is bound when this is made, so reads (often on a sampler thread)
    import nothing.
    """

    def __init__(self) -> None:
        import tensorflow as tf

        self._tf = tf
        self.devices: list[GPUDevice] = []
        if not tf.config.list_physical_devices("GPU"):
            return
        for ordinal, physical in logical_to_physical(tf):
            model = tf.config.experimental.get_device_details(physical).get("device_name")
            self.devices.append(GPUDevice(name=f"GPU:{len(self.devices)}", ordinal=ordinal,
                                          physical=physical.name, framework="TensorFlow",
                                          model=model))

    def read(self, name: str) -> dict[str, int] | None:
        """The allocator's `{"current": bytes, "peak": bytes}` for `name`, or `None`."""
        return read_memory(self._tf, name)

    def reset_peak(self, name: str) -> None:
        """Restarts `name`'s peak at its current use; a device TensorFlow refuses is skipped."""
        tf = self._tf
        try:
            tf.config.experimental.reset_memory_stats(name)
        except (ValueError, RuntimeError, tf.errors.OpError):
            pass


def logical_to_physical(tf: Any) -> list[tuple[int, Any]]:
    """For each logical GPU, its CUDA ordinal and physical device, in order."""
    mapping = []
    for physical in tf.config.get_visible_devices("GPU"):
        ordinal = int(physical.name.rpartition(":")[2])
        split = tf.config.get_logical_device_configuration(physical)
        mapping += [(ordinal, physical)] * (len(split) if split else 1)
    return mapping


def read_memory(tf: Any, device: str) -> dict[str, int] | None:
    """`tf.config.experimental.get_memory_info(device)` as ints, or `None` where refused."""
    try:
        info = tf.config.experimental.get_memory_info(device)
    except (ValueError, RuntimeError, tf.errors.OpError):
        return None
    return {"current": int(info["current"]), "peak": int(info["peak"])}
