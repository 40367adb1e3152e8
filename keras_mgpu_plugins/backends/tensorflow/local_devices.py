"""This process's TensorFlow devices, and the one reading of a device name.

`local_device_names()` names them for `kmp.topology()` without starting TensorFlow's
runtime. `logical_devices(kind)` lists them as TensorFlow does (which starts it): the
one listing that strategies, `multi_gpu_model`, model parallelism and `describe` use.
In a multi-worker job TensorFlow lists every worker's devices by their full names
(`/job:worker/replica:0/task:1/device:CPU:0`); `logical_devices` keeps this process's.
`device_spec(name)` is the one normaliser of a device string (`"/cpu:0"`, `"GPU:1"`).
"""

from __future__ import annotations

from typing import Any


def local_device_names() -> tuple[str, ...]:
    """This process's visible GPUs (split by `simulate_devices`), else its logical CPUs."""
    import tensorflow as tf

    gpus = tf.config.get_visible_devices("GPU")  # simulate_devices hides all GPUs but one
    if gpus:
        logical = _logical_count(tf, gpus)
        return tuple(f"GPU:{i}" for i in range(logical))
    cpus = tf.config.list_physical_devices("CPU")
    return tuple(f"CPU:{i}" for i in range(_logical_count(tf, cpus[:1])))


def _logical_count(tf: Any, physical: list) -> int:
    count = 0
    for device in physical:
        configured = tf.config.get_logical_device_configuration(device)
        count += len(configured) if configured else 1
    return count


def logical_devices(kind: str | None = None) -> list[str]:
    """This process's logical devices of `kind`, by TensorFlow's names, in its order.

    Args:
        kind: `"GPU"`, `"CPU"`, or `None` for every kind.

    Returns:
        The names TensorFlow lists (`"/device:GPU:0"`; its full names in a multi-worker
        job), of this process's devices only.
    """
    import tensorflow as tf

    names = [d.name for d in tf.config.list_logical_devices(kind)]
    here = this_task(names)
    if here is None:
        return names
    return [name for name in names if _task_of(device_spec(name)) in (None, here)]


def replica_devices() -> list[str]:
    """Where replicas (or stages) go by default: every logical GPU, else every logical CPU."""
    return logical_devices("GPU") or logical_devices("CPU")


def gpu_models() -> list[str]:
    """The model of each physical GPU of this machine (e.g. `"NVIDIA H100"`)."""
    import tensorflow as tf

    return [tf.config.experimental.get_device_details(g).get("device_name", "")
            for g in tf.config.list_physical_devices("GPU")]


def device_spec(name: str) -> Any:
    """`name` read as a `tf.DeviceSpec`, its device type in capitals (`"/cpu:0"` → CPU, 0).

    Raises:
        ValueError: If TensorFlow cannot read `name` as a device.
    """
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(name)
    return spec.replace(device_type=(spec.device_type or "").upper())


def this_task(names: list[str] | None = None) -> tuple | None:
    """(job, replica, task) of this process when the runtime knows a cluster, else `None`.

    Args:
        names: Device names TensorFlow listed: none of them naming a job means no
            cluster (and no need to ask). `None`: ask.
    """
    if names is not None and not any(name.startswith("/job:") for name in names):
        return None
    from keras_mgpu_plugins.backends.tensorflow.patches.hybrid import this_task as address

    return _task_of(device_spec(address()))


def _task_of(spec: Any) -> tuple | None:
    return None if spec.job is None else (spec.job, spec.replica, spec.task)
