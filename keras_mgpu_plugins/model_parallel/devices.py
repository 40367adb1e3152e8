"""Which devices model parallelism may use, and one spelling for each.

In a multi-worker job (`strategy="hybrid"`) TensorFlow lists every worker's devices, by
their full names (`/job:worker/replica:0/task:1/device:CPU:0`); a worker places its model
on its own devices only, spelled as in one process (`/device:CPU:1`).
"""

from __future__ import annotations

from collections.abc import Sequence


def local_devices() -> list[str]:
    """This process's devices: every logical GPU, else every logical CPU (simulated ones too)."""
    gpus = _local("GPU")
    return gpus or _local("CPU")


def _local(kind: str | None = None) -> list[str]:
    """This process's logical devices (of `kind`), spelled `/device:GPU:1`, in order."""
    import tensorflow as tf

    devices = tf.config.list_logical_devices(kind) if kind else tf.config.list_logical_devices()
    here = _this_task(tf, [d.name for d in devices])
    names = []
    for device in devices:
        spec = tf.DeviceSpec.from_string(device.name)
        if spec.job is None or (spec.job, spec.replica, spec.task) == here:
            names.append(f"/device:{spec.device_type}:{spec.device_index}")
    return names


def _this_task(tf: object, names: Sequence[str]) -> tuple | None:
    """(job, replica, task) of this process when the runtime knows a cluster, else `None`."""
    if not any(name.startswith("/job:") for name in names):
        return None
    from keras_mgpu_plugins import compat

    spec = tf.DeviceSpec.from_string(compat.this_task())
    return spec.job, spec.replica, spec.task


def canonical(name: str, argument: str = "devices") -> str:
    """`name` as this process lists it (`/device:GPU:1`), or an error listing what exists.

    Args:
        name: A device string (`"/gpu:1"`, `"GPU:1"`, `"/job:localhost/.../device:CPU:0"`).
        argument: What to call the value in the error.

    Raises:
        ValueError: If the device does not exist in this process.
    """
    import tensorflow as tf

    existing = _local()
    try:
        spec = tf.DeviceSpec.from_string(name if name.startswith("/") else "/" + name)
    except (ValueError, TypeError):
        spec = None
    if spec is not None and spec.device_type:
        wanted = f"/device:{spec.device_type.upper()}:{spec.device_index or 0}"
        if wanted in existing and _names_this_task(tf, spec):
            return wanted
    raise ValueError(
        f"{argument}: device {name!r} does not exist in this process. The devices that exist: "
        f"{existing}. (Simulated devices: call kmp.simulate_devices(n) first thing.)"
    )


def _names_this_task(tf: object, spec: object) -> bool:
    """Whether a device spec's job/task, if it names one, is this process's."""
    if spec.job is None or spec.job == "localhost":
        return True
    here = _this_task(tf, ["/job:"])
    return here is None or (spec.job, spec.replica or 0, spec.task or 0) == here


def resolve(devices: Sequence[str] | None) -> list[str]:
    """The stage devices: `devices` checked and spelled canonically, or every local device."""
    if devices is None:
        return local_devices()
    if isinstance(devices, str):
        raise TypeError(
            f"devices must be a list of device names or a mapping from layer-name patterns to "
            f"devices, not one string. Received: devices={devices!r}; did you mean [{devices!r}]?"
        )
    names = [canonical(d) for d in devices]
    if not names:
        raise ValueError("devices is empty: pass at least one device, or None for every local one.")
    if len(set(names)) != len(names):
        raise ValueError(f"devices lists a device twice. Received: devices={list(devices)!r}")
    return names
