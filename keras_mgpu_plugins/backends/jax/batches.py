"""Any batch, whatever its row count, on the devices of a `keras.distribution`, as on one device.

Keras lays every global batch out along the distribution's batch axis
(`jax.make_array_from_process_local_data` with the first batch's layout), which
needs the batch's rows to divide over that axis: a last batch of 5 rows on 2
devices, or `batch_size=5`, raises inside JAX. kmp feeds such a batch *whole to
every device* instead (a replicated layout): each device computes the whole
batch, so the step, its loss and metrics, BatchNormalization's statistics and
`predict`'s outputs are exactly one device's on the same rows (float summation
order aside). No padding, no masking: nothing a model computes over the batch
can see a row that is not there. The cost is that batch's work done on every
device: nothing for a last batch, all of the speed-up when `batch_size` itself
does not divide (kmp warns then).

A process's part of a global batch (`backends.jax.feeding`, over `inputs`) is its
rows where the batch divides over the axis, else the whole batch as a replicated
global `jax.Array` (`replicated`); `distribute` (the patch
`jax_partial_batches_replicated` on Keras's `_distribute_data`) passes such an array
on as it is, and replicates a batch that does not divide in a single process.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from keras_mgpu_plugins.inputs import packed
from keras_mgpu_plugins.inputs.streams import rows_of

#: Marks the distributions kmp made or adopted: only their batches are laid out here.
KMP_OWNED = "_kmp_owned"
_warned: set[tuple[int, int]] = set()


def own(distribution: Any) -> Any:
    """Marks `distribution` as one whose batches kmp lays out (see the module docstring)."""
    setattr(distribution, KMP_OWNED, True)
    return distribution


def owned(distribution: Any) -> bool:
    return bool(getattr(distribution, KMP_OWNED, False))


def axis_size(distribution: Any) -> int:
    """How many pieces a global batch is split into: the devices of the mesh's batch axis
    (every device for `DataParallel`; `ModelParallel` splits the batch along it only)."""
    mesh = distribution.device_mesh
    return int(mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)])


def divides(count: int, distribution: Any) -> bool:
    return count % axis_size(distribution) == 0


def replicated(batch: Any, distribution: Any) -> Any:
    """`batch` (whole, the same on every process) as global arrays replicated on every device
    of `distribution`'s mesh."""
    import jax
    import keras
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec())

    def place(a: Any) -> Any:
        if isinstance(a, jax.Array) and getattr(a, "sharding", None) == sharding:
            return a
        return jax.make_array_from_process_local_data(sharding, np.asarray(a))

    if _is_array(batch):  # a bare array (`(x,)` to Keras): a tuple, as Keras wants a non-numpy one
        return (place(batch),)
    return keras.tree.map_structure(lambda a: place(a) if _is_array(a) else a, batch)


def warn_if_never_divides(batch_size: int, distribution: Any, method: str) -> None:
    """One warning (per batch size and device count) when every full batch is computed whole
    on every device (no speed-up)."""
    devices = axis_size(distribution)
    if batch_size % devices and (batch_size, devices) not in _warned:
        _warned.add((batch_size, devices))
        warnings.warn(
            f"{method}: batch_size={batch_size} does not divide over the {devices} devices of "
            "the distribution, so every batch is computed whole on every device: the results "
            "are one device's, with none of the speed-up. Pass a batch_size that is a multiple "
            f"of {devices}.", UserWarning, stacklevel=4)


def patch_distribute_data() -> Any:
    """The patch: Keras's `_distribute_data` (JAX trainer) with kmp's rule above; the undo."""
    from keras_mgpu_plugins.compat._private import jax_trainer_module
    from keras_mgpu_plugins.compat._record import replace

    module = jax_trainer_module()
    original = module._distribute_data

    def _distribute_data(data: Any, layouts: Any = None, **kwargs: Any) -> Any:
        # a batch of more than 3 parts kmp served packed (`inputs.packed`): laid out as it is,
        # then given to the step as the input yielded it
        return packed.unpack(distribute(original, data, layouts, **kwargs))

    return replace(module, "_distribute_data", _distribute_data)


def distribute(original: Any, data: Any, layouts: Any = None, **kwargs: Any) -> Any:
    """Keras's `_distribute_data`, but a batch kmp placed whole (a replicated global array
    among its leaves) is placed whole, and in one process a batch whose rows do not divide
    over the batch axis is replicated (under a distribution kmp owns).

    Keras's further arguments (`is_super_batch` from Keras 3.16: the stacked batches of
    `steps_per_execution`, batch axis second) go to Keras's own code, which lays a super
    batch out itself."""
    import jax
    import keras

    distribution = keras.distribution.distribution()
    if distribution is None or not owned(distribution) or kwargs.get("is_super_batch"):
        return original(data, layouts, **kwargs)
    leaves = [a for a in keras.tree.flatten(data) if _is_array(a)]
    placed = any(isinstance(a, jax.Array) and not a.is_fully_addressable for a in leaves) or (
        jax.process_count() == 1 and any(_replicated_on(a, distribution) for a in leaves))
    if placed or (jax.process_count() == 1 and leaves
                  and not divides(rows_of(data), distribution)):
        return replicated(data, distribution)
    return original(data, layouts, **kwargs)


def _replicated_on(a: Any, distribution: Any) -> bool:
    import jax

    sharding = getattr(a, "sharding", None) if isinstance(a, jax.Array) else None
    mesh = getattr(sharding, "mesh", None)
    return (mesh is not None and mesh == distribution.device_mesh.backend_mesh
            and sharding.is_fully_replicated and len(mesh.devices.flat) > 1)


def _is_array(value: Any) -> bool:
    return bool(getattr(value, "shape", ()))
