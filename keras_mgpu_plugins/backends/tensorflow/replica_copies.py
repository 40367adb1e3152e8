"""The variables `WeightSyncVerifier` checks, as TensorFlow holds them on this worker.

Reached through `TensorFlowRuntime.track` (the callback imports no backend).

`Tracked` lists the variables to check (by `_weight_sync.classify`), this
worker's per-replica copies of each (`local_copies`) and their fingerprinter;
`host_value` reads one copy, `assign` writes one (`"resync"`, `sync_stats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mgpu_plugins.backends.tensorflow import fingerprint
from keras_mgpu_plugins.callbacks._weight_sync import classify


class Tracked:
    """The variables to check, their per-replica copies, and their fingerprinter."""

    def __init__(self, strategy: Any, variables: list, optimizer_vars: list,
                 statistics: Sequence[str], key: tuple) -> None:
        import tensorflow as tf

        self.key, self.paths, self.roles, self.copies = key, [], [], []
        seen: set[int] = set()
        for role, group in (("model", variables), ("optimizer", optimizer_vars)):
            for var in group:
                name = var.path.rsplit("/", 1)[-1]
                kind = classify(name, var.trainable, getattr(var, "synchronization", "auto"),
                                fingerprint.supports(tf.as_dtype(var.dtype)), statistics)
                if kind is None or id(var) in seen:
                    continue
                seen.add(id(var))
                self.paths.append(var.path)
                self.roles.append("statistic" if kind == "statistic" else role)
                self.copies.append(local_copies(strategy, var))
        self.replicas = len(self.copies[0]) if self.copies else 1
        groups = [[copies[r] for copies in self.copies] for r in range(self.replicas)]
        self.fingerprints = fingerprint.make_fingerprinter(groups)

    @staticmethod
    def host_value(copy: Any) -> np.ndarray:
        """One copy's value, on the host."""
        return host_value(copy)

    @staticmethod
    def assign(copy: Any, value: np.ndarray) -> None:
        """Writes `value` into one copy, on that copy's device."""
        assign(copy, value)


def local_copies(strategy: Any, variable: Any) -> tuple:
    """This worker's per-replica copies of a Keras variable (its tf.Variable components).

    The one place that reaches through Keras (`variable.value`, the backend
    variable) into `tf.distribute` (`experimental_local_results`): the copies are
    read for fingerprints and written by `"resync"` and `sync_stats`.
    """
    return tuple(strategy.experimental_local_results(variable.value))


def host_value(copy: Any) -> np.ndarray:
    """One copy's value, on the host."""
    return np.asarray(copy.numpy())


def assign(copy: Any, value: np.ndarray) -> None:
    """Writes `value` into one copy, on that copy's device."""
    import tensorflow as tf

    with tf.device(copy.device):
        copy.assign(tf.constant(np.asarray(value).astype(copy.dtype.as_numpy_dtype)))
