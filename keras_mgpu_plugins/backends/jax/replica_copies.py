"""The variables `WeightSyncVerifier` checks, as JAX holds them in this process.

Reached through `JaxRuntime.track` (the callback imports no backend). Under
`keras.distribution.DataParallel` each variable is one `jax.Array` replicated
on every device of every process: this process's copies are its
`addressable_shards`, one per local device, in `jax.local_devices()` order
(replica `r` of worker `w` is device `r` of process `w`). A variable sharded
rather than replicated (model parallel layouts) holds different pieces on
different devices, not copies: it is not checked here.

`Tracked` lists the variables to check (by `_weight_sync.classify`), their
copies (`Copy`: a variable and one of its devices) and their fingerprinter;
`host_value` reads one copy, `assign` writes one (`"resync"`, `sync_stats`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mgpu_plugins.callbacks._weight_sync import classify


class Copy:
    """One device's copy of a Keras variable's (replicated) `jax.Array`."""

    def __init__(self, variable: Any, device: Any) -> None:
        self.variable, self.device = variable, device

    def shard(self) -> Any:
        """The variable's current buffer on this copy's device (read at call time: every
        training step replaces the variable's array)."""
        for shard in self.variable.value.addressable_shards:
            if shard.device == self.device:
                return shard.data
        raise RuntimeError(f"{self.variable.path} has no copy on {self.device} any more")


def replicated(value: Any) -> bool:
    """Whether every device holds the whole of `value` (its copies must be identical)."""
    sharding = getattr(value, "sharding", None)
    return sharding is not None and bool(sharding.is_fully_replicated)


class Tracked:
    """The variables to check, their per-device copies in this process, their fingerprinter."""

    def __init__(self, variables: list, optimizer_vars: list, statistics: Sequence[str],
                 key: tuple) -> None:
        self.key, self.paths, self.roles, self.copies = key, [], [], []
        seen: set[int] = set()
        for role, group in (("model", variables), ("optimizer", optimizer_vars)):
            for var in group:
                name = var.path.rsplit("/", 1)[-1]
                supported = np.dtype(var.value.dtype).kind in "fiub" and replicated(var.value)
                kind = classify(name, var.trainable, getattr(var, "synchronization", "auto"),
                                supported, statistics)
                if kind is None or id(var) in seen:
                    continue
                seen.add(id(var))
                self.paths.append(var.path)
                self.roles.append("statistic" if kind == "statistic" else role)
                self.copies.append(local_copies(var))
        self.replicas = len(self.copies[0]) if self.copies else 1

    def fingerprints(self) -> np.ndarray:
        """`(replicas, variables)` int64: a CRC-32 of each copy's bytes, read on the host."""
        out = np.zeros((self.replicas, len(self.copies)), np.int64)
        for v, copies in enumerate(self.copies):
            for r, copy in enumerate(copies):
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
    """This process's copies of a replicated Keras variable, one per local device, in order."""
    import jax

    order = {device: i for i, device in enumerate(jax.local_devices())}
    devices = sorted((s.device for s in variable.value.addressable_shards),
                     key=lambda d: order.get(d, len(order) + d.id))
    return tuple(Copy(variable, d) for d in devices)


def host_value(copy: Copy) -> np.ndarray:
    """One copy's value, on the host."""
    return np.asarray(copy.shard())


def assign(copy: Copy, value: np.ndarray) -> None:
    """Replaces the variable's buffer on `copy.device` by `value`, keeping its other copies
    and its sharding (no collective: each process rebuilds its own part of the array)."""
    import jax

    current = copy.variable.value
    arrays = [jax.device_put(np.asarray(value, dtype=current.dtype), s.device)
              if s.device == copy.device else s.data for s in current.addressable_shards]
    copy.variable.assign(jax.make_array_from_single_device_arrays(
        current.shape, current.sharding, arrays))
