"""The variables `WeightSyncVerifier` checks, as JAX holds them in this process.

Reached through `JaxRuntime.track` (the callback imports no backend). A variable is
one `jax.Array` laid over devices of one or several processes: each device holds one
piece of it (`sharding.devices_indices_map`), the whole under `DataParallel`, a slice
under `strategy="model_parallel"` / `"hybrid"`. The devices that hold the same piece
hold copies, which must be identical; different pieces are not compared.

So each variable is checked piece by piece: one entry per distinct piece (`shards`:
`""` for the whole, `"[:, 0:16]"` for a slice), with its copies on this process's
devices (`copies[e][r]`: this process's `r`-th device, `None` where that device holds
another piece). Every process lists the same entries in the same order (the layout is
known everywhere), so the fingerprints (`ABSENT` where a device holds no copy) line up
across processes. Under `DataParallel` there is one entry per variable, with a copy on
every device: the data-parallel check. Under `"model_parallel"`, a sharded variable's
pieces have one copy each in the process (nothing to compare), its replicated ones one
per device; under `"hybrid"`, each piece has a copy on every process (the "batch" axis).

`host_value` reads one copy, `assign` writes one (`"resync"`, `sync_stats`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mgpu_plugins.callbacks._weight_sync import ABSENT, classify

Piece = tuple[tuple[int, int], ...]


class Copy:
    """One device's copy of one piece of a Keras variable's `jax.Array`."""

    def __init__(self, variable: Any, device: Any) -> None:
        self.variable, self.device = variable, device

    def shard(self) -> Any:
        """The variable's current buffer on this copy's device (read at call time: every
        training step replaces the variable's array)."""
        for device, data in local_buffers(self.variable.value):
            if device == self.device:
                return data
        raise RuntimeError(f"{self.variable.path} has no copy on {self.device} any more")


def piece_of(index: tuple, shape: tuple) -> Piece:
    """A device's piece of an array of `shape`, as `(start, stop)` per dimension."""
    return tuple((s.start or 0, size if s.stop is None else s.stop)
                 for s, size in zip(index, shape, strict=True))


def label(piece: Piece, shape: tuple) -> str:
    """`""` for the whole array, else its slice, e.g. `"[:, 0:16]"` (as `placement_report`)."""
    whole = [(0, n) for n in shape]
    if list(piece) == whole:
        return ""
    return "[" + ", ".join(":" if p == w else f"{p[0]}:{p[1]}"
                           for p, w in zip(piece, whole, strict=True)) + "]"


def holders(value: Any) -> dict[Any, Piece]:
    """Every device (of every process) that holds part of `value`, and its piece."""
    shape = tuple(value.shape)
    return {d: piece_of(i, shape) for d, i in value.sharding.devices_indices_map(shape).items()}


class Tracked:
    """The pieces to check, their per-device copies in this process, their fingerprinter."""

    def __init__(self, variables: list, optimizer_vars: list, statistics: Sequence[str],
                 key: tuple) -> None:
        import jax

        self.key, self.paths, self.roles, self.copies = key, [], [], []
        self.shards: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.dtypes: list[np.dtype] = []
        chosen, seen = [], set()
        for role, group in (("model", variables), ("optimizer", optimizer_vars)):
            for var in group:
                name = var.path.rsplit("/", 1)[-1]
                supported = np.dtype(var.value.dtype).kind in "fiub"
                kind = classify(name, var.trainable, getattr(var, "synchronization", "auto"),
                                supported, statistics)
                if kind is None or id(var) in seen:
                    continue
                seen.add(id(var))
                chosen.append((var, "statistic" if kind == "statistic" else role,
                               holders(var.value)))
        mine = jax.process_index()
        order = {d: i for i, d in enumerate(jax.local_devices())}
        used = {d for _, _, held in chosen for d in held}
        self.devices = sorted((d for d in used if d.process_index == mine),
                              key=lambda d: order.get(d, len(order) + d.id))
        per_process: dict[int, int] = {}
        for device in used:
            per_process[device.process_index] = per_process.get(device.process_index, 0) + 1
        # The same on every process (the fingerprints are gathered): the most devices any
        # process holds variables on; a process with fewer has ABSENT copies there.
        self.replicas = max(per_process.values(), default=1)
        padding = (None,) * (self.replicas - len(self.devices))
        for var, role, held in chosen:
            shape = tuple(int(n) for n in var.value.shape)
            for piece in sorted(set(held.values())):
                self.paths.append(var.path)
                self.roles.append(role)
                self.shards.append(label(piece, shape))
                self.shapes.append(tuple(b - a for a, b in piece))
                self.dtypes.append(np.dtype(var.value.dtype))
                self.copies.append(tuple(Copy(var, d) if held.get(d) == piece else None
                                         for d in self.devices) + padding)

    def fingerprints(self) -> np.ndarray:
        """`(replicas, entries)` int64: a CRC-32 of each copy's bytes read on the host,
        `ABSENT` where this process's device holds no copy of that piece."""
        out = np.full((self.replicas, len(self.copies)), ABSENT, np.int64)
        for v, copies in enumerate(self.copies):
            for r, copy in enumerate(copies):
                if copy is not None:
                    out[r, v] = zlib.crc32(np.ascontiguousarray(host_value(copy)).tobytes())
        return out

    @staticmethod
    def host_value(copy: Copy) -> np.ndarray:
        """One copy's value, on the host."""
        return host_value(copy)

    @staticmethod
    def assign(copy: Copy, value: np.ndarray) -> None:
        """Writes `value` into one copy, on that copy's device (the others unchanged)."""
        assign(copy, value)


def local_copies(variable: Any) -> tuple[Copy, ...]:
    """This process's per-device buffers of a Keras variable, one per local device holding
    part of it, in `jax.local_devices()` order (copies of one piece, or different pieces)."""
    import jax

    order = {device: i for i, device in enumerate(jax.local_devices())}
    devices = sorted((device for device, _ in local_buffers(variable.value)),
                     key=lambda d: order.get(d, len(order) + d.id))
    return tuple(Copy(variable, d) for d in devices)


def local_buffers(array: Any) -> list[tuple[Any, Any]]:
    """`(device, single-device array)` for each of this process's devices holding part of
    `array`. On JAX 0.10 `addressable_shards` raises for an array that `jax.device_put`
    replicated from a `jax.Array` over several processes of one device each ("An argument
    array had 2 shard(s)": Keras's variables under `DataParallel` on `kmp-launch -n 2`); its
    one local copy is then `addressable_data(0)`."""
    try:
        return [(shard.device, shard.data) for shard in array.addressable_shards]
    except ValueError:
        if len(array.sharding.addressable_devices) != 1:
            raise
        data = array.addressable_data(0)
        return [(next(iter(data.devices())), data)]


def host_value(copy: Copy) -> np.ndarray:
    """One copy's value, on the host."""
    return np.asarray(copy.shard())


def assign(copy: Copy, value: np.ndarray) -> None:
    """Replaces the variable's buffer on `copy.device` by `value` (that device's piece),
    keeping its other buffers and its sharding (no collective: each process rebuilds its
    own part of the array)."""
    import jax

    current = copy.variable.value
    arrays = [jax.device_put(np.asarray(value, dtype=current.dtype), device)
              if device == copy.device else data for device, data in local_buffers(current)]
    copy.variable.assign(jax.make_array_from_single_device_arrays(
        current.shape, current.sharding, arrays))
