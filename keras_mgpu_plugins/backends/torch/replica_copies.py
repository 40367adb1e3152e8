"""The variables `WeightSyncVerifier` checks, as torch holds them in this process.

Reached through `TorchRuntime.track` (the callback imports no backend). One process
drives one device, so each variable has one copy here (`replicas == 1`); the check
compares the processes' copies (their fingerprints, gathered by the callback).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mgpu_plugins.callbacks._weight_sync import classify


class Tracked:
    """The variables to check, this process's copy of each, their fingerprinter."""

    replicas = 1

    def __init__(self, variables: list, optimizer_vars: list, statistics: Sequence[str],
                 key: tuple) -> None:
        self.key, self.paths, self.roles, self.copies = key, [], [], []
        self.shapes: list[tuple[int, ...]] = []
        self.dtypes: list[np.dtype] = []
        seen: set[int] = set()
        for role, group in (("model", variables), ("optimizer", optimizer_vars)):
            for var in group:
                name = var.path.rsplit("/", 1)[-1]
                dtype = np.dtype(host_value(var).dtype)
                kind = classify(name, var.trainable, getattr(var, "synchronization", "auto"),
                                dtype.kind in "fiub", statistics)
                if kind is None or id(var) in seen:
                    continue
                seen.add(id(var))
                self.paths.append(var.path)
                self.roles.append("statistic" if kind == "statistic" else role)
                self.copies.append((var,))
                self.shapes.append(tuple(int(n) for n in var.shape))
                self.dtypes.append(dtype)

    def fingerprints(self) -> np.ndarray:
        """`(1, variables)` int64: a CRC-32 of each variable's bytes read on the host."""
        return np.array([[zlib.crc32(np.ascontiguousarray(host_value(copies[0])).tobytes())
                          for copies in self.copies]], np.int64)

    @staticmethod
    def host_value(copy: Any) -> np.ndarray:
        return host_value(copy)

    @staticmethod
    def assign(copy: Any, value: np.ndarray) -> None:
        copy.assign(np.asarray(value).astype(host_value(copy).dtype))


def host_value(variable: Any) -> np.ndarray:
    """A Keras variable's value on the host (a copy: bfloat16 read as float32)."""
    import keras

    value = keras.ops.convert_to_numpy(variable.value)
    return np.array(value, copy=True)
