"""Which devices model parallelism may use, and one spelling for each."""

from __future__ import annotations

from collections.abc import Sequence


def local_devices() -> list[str]:
    """This process's devices: every logical GPU, else every logical CPU (simulated ones too)."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]


def canonical(name: str, argument: str = "devices") -> str:
    """`name` as this process lists it (`/device:GPU:1`), or an error listing what exists.

    Args:
        name: A device string (`"/gpu:1"`, `"GPU:1"`, `"/job:localhost/.../device:CPU:0"`).
        argument: What to call the value in the error.

    Raises:
        ValueError: If the device does not exist in this process.
    """
    import tensorflow as tf

    existing = [d.name for d in tf.config.list_logical_devices()]
    try:
        spec = tf.DeviceSpec.from_string(name if name.startswith("/") else "/" + name)
    except (ValueError, TypeError):
        spec = None
    if spec is not None and spec.device_type:
        wanted = f"/device:{spec.device_type.upper()}:{spec.device_index or 0}"
        if wanted in existing:
            return wanted
    raise ValueError(
        f"{argument}: device {name!r} does not exist in this process. The devices that exist: "
        f"{existing}. (Simulated devices: call kmp.simulate_devices(n) first thing.)"
    )


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
