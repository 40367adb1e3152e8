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

    def __init__(self, distribution: Any = None, local: bool = False) -> None:
        self._distribution, self._local = distribution, local

    @classmethod
    def for_model(cls, model: Any | None = None) -> JaxRuntime:
        """The runtime of `model`: a model kmp built runs under its own distribution
        (`backends.jax.models`); a model that runs under no distribution spanning the
        processes (one loaded or built on one process) is local: its collectives are this
        process's alone (no other process takes part), its chief the job's."""
        import keras

        from keras_mgpu_plugins.backends.jax import models

        if model is None:
            return cls()
        distribution = models.distribution_of(model) or keras.distribution.distribution()
        return cls(distribution, local=not _spans_processes(distribution))

    def distribution(self) -> Any:
        """The model's distribution, else the one in force in this thread, else that of the
        last model kmp built in this process (or `None`)."""
        import keras

        from keras_mgpu_plugins.backends.jax import models

        return (self._distribution or keras.distribution.distribution()
                or models.last_distribution())

    def rank(self) -> Rank:
        if not distributed_initialized():
            return _environment_rank()
        import jax

        index, count = int(jax.process_index()), int(jax.process_count())
        return Rank(index, count, index == 0)

    @property
    def spans_workers(self) -> bool:
        if self._local or not distributed_initialized():
            return False
        import jax

        return jax.process_count() > 1

    def store(self) -> Any:
        """The key-value store of `jax.distributed`'s coordination service (`None` where the
        installed JAX does not have it as known)."""
        from keras_mgpu_plugins.compat._private import jax_coordination_client

        client = jax_coordination_client() if self.spans_workers else None
        return _JaxStore(client) if client is not None else None

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

        distribution = self.distribution()
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
        distribution = self.distribution()
        if distribution is None:
            return 1
        mesh = distribution.device_mesh
        axis = getattr(distribution, "batch_dim_name", None) or mesh.axis_names[0]
        return int(mesh.shape[list(mesh.axis_names).index(axis)])

    def track(self, variables: list, optimizer_vars: list, statistics: Any, key: tuple) -> Any:
        """This process's per-device copies of the variables to check, and their fingerprinter."""
        from keras_mgpu_plugins.backends.jax.replica_copies import Tracked

        return Tracked(variables, optimizer_vars, statistics, key)


def apart(model: Any) -> str | None:
    """Why `model` would train apart from the job's other processes (`runtime.apart`): it
    runs under no `keras.distribution` whose mesh spans them (`None` where it does)."""
    if JaxRuntime.for_model(model).spans_workers:
        return None
    import keras

    from keras_mgpu_plugins.backends.jax import models

    distribution = models.distribution_of(model) or keras.distribution.distribution()
    runs = ("under no keras.distribution" if distribution is None else
            f"under a {type(distribution).__name__} over this process's devices only")
    if models.arranged(model) is not None:  # strategy="model_parallel": one process's devices
        runs += (" (strategy='model_parallel' splits a model over one process's devices; "
                 "strategy='hybrid' trains one model over every process: the data across the "
                 "processes, the model split within each)")
    return ("on JAX a model trains as one over several processes only under a "
            "keras.distribution whose device mesh spans them (jax.distributed started first), "
            f"and this one runs {runs}")


class _JaxStore:
    """`runtime.calls.Store` over JAX's coordination service client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def set(self, key: str, value: str) -> None:
        self.client.key_value_set(key, value)

    def get(self, key: str) -> str | None:
        try:
            return self.client.key_value_try_get(key)
        except Exception:  # noqa: BLE001 - NotFound is a runtime error of JAX's
            return None

    def dir(self, prefix: str) -> dict[int, str]:
        try:
            entries = self.client.key_value_dir_get(prefix)
        except Exception:  # noqa: BLE001 - an empty directory raises in some JAX versions
            return {}
        return {int(key.rstrip("/").rsplit("/", 1)[1]): value for key, value in entries}


def _spans_processes(distribution: Any) -> bool:
    """Whether `distribution`'s mesh holds devices of several processes."""
    if distribution is None or not distributed_initialized():
        return False
    devices = np.asarray(distribution.device_mesh.backend_mesh.devices).ravel()
    return len({d.process_index for d in devices}) > 1


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
