"""`JaxRuntime`: `kmp.runtime` over JAX's processes (`jax.distributed`) and `keras.distribution`.

The rank is JAX's (`jax.process_index()` of `jax.process_count()`, process 0 the
chief): the one source of "who am I" once `jax.distributed` is initialised, and
the environment's plan (`kmp.topology()`) before, so reading it never starts
JAX's backend. `all_gather` is `jax.experimental.multihost_utils.process_allgather`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_mgpu_plugins.runtime import Rank, Runtime


def distributed_initialized() -> bool:
    """Whether `jax.distributed` was initialised in this process (no backend started)."""
    import jax

    return bool(jax.distributed.is_initialized())


class JaxRuntime(Runtime):
    """The runtime of this JAX process: its rank among JAX's processes, their collectives."""

    @classmethod
    def for_model(cls, model: Any | None = None) -> JaxRuntime:
        """The runtime of `model` (every model of a JAX process shares its processes)."""
        return cls()

    def rank(self) -> Rank:
        if not distributed_initialized():
            return _environment_rank()
        import jax

        index, count = int(jax.process_index()), int(jax.process_count())
        return Rank(index, count, index == 0)

    @property
    def spans_workers(self) -> bool:
        if not distributed_initialized():
            return False
        import jax

        return jax.process_count() > 1

    def _gather(self, wire: np.ndarray) -> np.ndarray:
        """Every process's `wire` (int64 or float64, one shape), stacked in process order.

        JAX keeps 64-bit values only with `jax_enable_x64`; without it they travel as
        two 32-bit words each (exact for every value), never as a lossy float32.
        """
        from jax.experimental import multihost_utils

        words = np.ascontiguousarray(wire).view(np.uint32)  # (..., 2 * last) exact bits
        gathered = np.asarray(multihost_utils.process_allgather(words, tiled=False))
        return np.ascontiguousarray(gathered).view(wire.dtype).reshape(
            (gathered.shape[0], *wire.shape))

    def describe(self) -> dict[str, Any]:
        """The distribution's name, its devices, the devices' kind, JAX's version."""
        import jax
        import keras

        distribution = keras.distribution.distribution()
        devices = _distribution_devices(distribution)
        return {
            "strategy": type(distribution).__name__ if distribution is not None else "default",
            "devices": devices or [str(jax.devices()[0])],
            "processes": jax.process_count() if distributed_initialized() else 1,
            "device_kind": jax.devices()[0].device_kind,
            "jax_version": jax.__version__,
        }

    @property
    def replicas_in_sync(self) -> int:
        """Devices of the active `keras.distribution` over every process (else 1)."""
        import keras

        distribution = keras.distribution.distribution()
        if distribution is None:
            return 1
        mesh = distribution.device_mesh
        axis = getattr(distribution, "batch_dim_name", None) or mesh.axis_names[0]
        return int(mesh.shape[list(mesh.axis_names).index(axis)])

    def track(self, variables: list, optimizer_vars: list, statistics: Any, key: tuple) -> Any:
        """This process's per-device copies of the variables to check, and their fingerprinter."""
        from keras_mgpu_plugins.backends.jax.replica_copies import Tracked

        return Tracked(variables, optimizer_vars, statistics, key)


def _distribution_devices(distribution: Any) -> list[str]:
    if distribution is None:
        return []
    return [str(d) for d in np.asarray(distribution.device_mesh.devices).ravel()]


def _environment_rank() -> Rank:
    """Before `jax.distributed` starts: the plan of the environment (`kmp.topology()`)."""
    from keras_mgpu_plugins.cluster.processes import planned_processes

    plan = planned_processes()
    if plan is None:
        return Rank(0, 1, True)
    return Rank(plan.process_id, plan.num_processes, plan.process_id == 0)
