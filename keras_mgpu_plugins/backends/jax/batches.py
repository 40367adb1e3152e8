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

`piece` gives a process its part of a global batch: rows `[p*b, (p+1)*b)` where
the batch divides over the axis, else the whole batch as a replicated global
`jax.Array`; `distribute` (the patch `jax_partial_batches_replicated` on Keras's
`_distribute_data`) passes such an array on as it is, and replicates a batch
that does not divide in a single process.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

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


def rows(batch: Any) -> int:
    """The rows of `batch`'s arrays (-2 when they differ, 0 when it holds none)."""
    import keras

    sizes = {int(a.shape[0]) for a in keras.tree.flatten(batch) if _is_array(a)}
    return sizes.pop() if len(sizes) == 1 else 0 if not sizes else -2


def divides(count: int, distribution: Any) -> bool:
    return count % axis_size(distribution) == 0


def piece(batch: Any, distribution: Any) -> Any:
    """This process's part of the global `batch` (every process holds it whole): its rows
    `[p*b, (p+1)*b)` where the batch divides over the batch axis, else the whole batch,
    replicated on every device (a global `jax.Array`)."""
    import jax
    import keras

    count = rows(batch)
    if not divides(count, distribution):
        return replicated(batch, distribution)
    size = count // jax.process_count()
    start = jax.process_index() * size
    return keras.tree.map_structure(
        lambda a: a[start:start + size] if _is_array(a) else a, batch)


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
        return distribute(original, data, layouts, **kwargs)

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
                  and not divides(rows(data), distribution)):
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


def global_batches(arrays: tuple, batch: int, mode: Any, distribution: Any) -> Any:
    """A `keras.utils.PyDataset` of this process's `piece` of every global batch of `arrays`
    (`(x, y, sample_weight)`, global, `None` where absent), the rows in one order per pass:
    `mode` is fit's `shuffle` (`False`: in order; `True`, `"batch"`: a permutation the
    processes share, a new one each pass, `backends.jax.shuffle`)."""
    import keras

    from keras_mgpu_plugins import _data_order
    from keras_mgpu_plugins.backends.jax import shuffle

    total = int(keras.tree.flatten(arrays[0])[0].shape[0])
    present = tuple(a for a in arrays if a is not None)
    seed = shuffle.agreed_seed() if mode else None

    class GlobalBatches(keras.utils.PyDataset):
        """This process's pieces of the global batches of one order of the rows per pass."""

        def __init__(self) -> None:
            super().__init__()
            self.passes = 0  # batch 0 asked for: a new pass over the data (a new order)
            self.order = np.arange(total)

        @property
        def num_batches(self) -> int:
            return -(-total // batch)

        def __len__(self) -> int:
            return self.num_batches

        def state(self) -> dict:  # `_data_order`: resumed by BackupAndRestore
            return {"seed": seed, "passes": self.passes, "rows": total, "mode": str(mode)}

        def restore(self, state: dict) -> None:
            nonlocal seed
            if state.get("rows") == total and state.get("mode") == str(mode):
                seed, self.passes = int(state["seed"]), int(state["passes"])

        def __getitem__(self, i: int) -> tuple:
            if i == 0:
                self.passes += 1
                if mode:
                    self.order = shuffle.epoch_order(total, batch, seed, self.passes, mode)
            rows = _piece_rows(self.order[i * batch:(i + 1) * batch], distribution)
            taken = tuple(keras.tree.map_structure(lambda a: np.asarray(a)[rows], a)
                          for a in present)
            if len(rows) and not divides(len(self.order[i * batch:(i + 1) * batch]),
                                         distribution):
                return replicated(taken, distribution)
            return taken

    feeding = GlobalBatches()
    # a shuffled order BackupAndRestore records and restores (`_data_order`); fit's x last
    _data_order.register(feeding if mode else None)
    return feeding


def _piece_rows(rows: np.ndarray, distribution: Any) -> np.ndarray:
    """The rows of one global batch that this process feeds (all of them if they do not
    divide over the batch axis)."""
    import jax

    if not divides(len(rows), distribution):
        return rows
    size = len(rows) // jax.process_count()
    return rows[jax.process_index() * size:(jax.process_index() + 1) * size]
