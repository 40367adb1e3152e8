"""Which devices model parallelism may use, and one spelling for each.

In a multi-worker job (`strategy="hybrid"`) TensorFlow lists every worker's devices, by
their full names (`/job:worker/replica:0/task:1/device:CPU:0`); a worker places its model
on its own devices only, spelled as in one process (`/device:CPU:1`).
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_mgpu_plugins.backends.tensorflow import local_devices as _local_devices


def local_devices() -> list[str]:
    """This process's devices: every logical GPU, else every logical CPU (simulated ones too)."""
    return _spelled(_local_devices.replica_devices())


def _spelled(names: Sequence[str]) -> list[str]:
    """This process's devices as one process spells them: `/device:GPU:1`."""
    return [_short(_local_devices.device_spec(name)) for name in names]


def _short(spec: object) -> str:
    return f"/device:{spec.device_type}:{spec.device_index or 0}"


def canonical(name: str, argument: str = "devices") -> str:
    """`name` as this process lists it (`/device:GPU:1`), or an error listing what exists.

    Args:
        name: A device string (`"/gpu:1"`, `"GPU:1"`, `"/job:localhost/.../device:CPU:0"`).
        argument: What to call the value in the error.

    Raises:
        ValueError: If the device does not exist in this process.
    """
    existing = _spelled(_local_devices.logical_devices())
    try:
        spec = _local_devices.device_spec(name)
    except (ValueError, TypeError):
        spec = None
    if spec is not None and spec.device_type:
        wanted = _short(spec)
        if wanted in existing and _names_this_task(spec):
            return wanted
    raise ValueError(
        f"{argument}: device {name!r} does not exist in this process. The devices that exist: "
        f"{existing}. (Simulated devices: call kmp.simulate_devices(n) first thing.)"
    )


def _names_this_task(spec: object) -> bool:
    """Whether a device spec's job/task, if it names one, is this process's."""
    if spec.job is None or spec.job == "localhost":
        return True
    here = _local_devices.this_task()
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
