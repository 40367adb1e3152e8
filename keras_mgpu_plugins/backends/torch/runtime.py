"""`TorchRuntime`: `kmp.runtime` over torch's default process group.

The rank is the process group's (`torch.distributed.get_rank()` of `get_world_size()`,
rank 0 the chief) once one exists, whoever started it (kmp, `keras.distribution.
initialize`, or the script's own `init_process_group`); before, the environment's plan
(`kmp.topology()`: torchrun's `WORLD_SIZE`/`RANK`, `kmp-launch`, SLURM), so the chief is
known even where no collective can run yet. `all_gather` is the group's; the key-value
store of the calls check is the group's own store.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_mgpu_plugins.backends.torch import collectives
from keras_mgpu_plugins.runtime import Rank, Runtime


class TorchRuntime(Runtime):
    """This process in its torch job: its rank in the process group, its collectives.

    Args:
        local: The runtime of a model that trains on this process alone (`apart`): the
            job's rank, and collectives answered here.
    """

    def __init__(self, local: bool = False) -> None:
        self._local = local

    @classmethod
    def for_model(cls, model: Any | None = None) -> TorchRuntime:
        """The runtime of `model`: the process group's, or local where `model` trains apart."""
        return cls(local=model is not None and apart(model) is not None)

    def rank(self) -> Rank:
        if not collectives.initialized():
            return environment_rank()
        index, count = collectives.world()
        return Rank(index, count, index == 0)

    @property
    def spans_workers(self) -> bool:
        return not self._local and collectives.world()[1] > 1

    def _gather(self, wire: np.ndarray) -> np.ndarray:
        return collectives.gather_numpy(wire)

    def store(self) -> Any:
        """The process group's key-value store (`None` where this torch hides it)."""
        from keras_mgpu_plugins.compat._torch import default_store

        store = default_store() if self.spans_workers else None
        return _TorchStore(store, collectives.world()[1]) if store is not None else None

    def describe(self) -> dict[str, Any]:
        """The data-parallel engine, this process's device, the processes, torch's version."""
        import torch

        from keras_mgpu_plugins.backends.torch import devices

        count = collectives.world()[1]
        return {"strategy": "DistributedDataParallel" if count > 1 else "default",
                "devices": [devices.device_name()], "processes": count,
                "device_kind": devices.device_kind(), "torch_version": torch.__version__}

    @property
    def replicas_in_sync(self) -> int:
        """One replica per process of the group."""
        return collectives.world()[1]

    def track(self, variables: list, optimizer_vars: list, statistics: Any, key: tuple) -> Any:
        """This process's one copy of each variable to check, and their fingerprinter."""
        from keras_mgpu_plugins.backends.torch.replica_copies import Tracked

        return Tracked(variables, optimizer_vars, statistics, key)


def apart(model: Any) -> str | None:
    """Why `model` would train apart from the job's other processes (`runtime.apart`), or
    `None`: `@kmp.parallelize` built it for the job, or Keras's own `fit` wraps it in
    DistributedDataParallel (keras-nightly 3.16.0.dev, where a process group exists).

    Measured, Keras 3.15 without kmp: 2 processes, each its half of 256 rows, weights 0.16
    apart, losses 3.72 and 2.78."""
    import keras

    from keras_mgpu_plugins.backends.torch import models
    from keras_mgpu_plugins.compat._torch import keras_has_upstream_ddp

    if models.arranged(model) is not None:
        return None
    if keras_has_upstream_ddp() and collectives.initialized():
        return None  # Keras's own DistributedDataParallel keeps one model
    version = keras.__version__
    if keras_has_upstream_ddp():
        return (f"Keras {version} wraps the model in DistributedDataParallel only where a "
                "torch process group exists, and none was started here")
    return (f"Keras {version} has no data parallelism in fit on torch (no release up to 3.15 "
            "has: DistributedDataParallel in fit comes with keras-team/keras#23316, after "
            "3.15)")


class _TorchStore:
    """`runtime.calls.Store` over a `torch.distributed.Store` (which lists no keys: `dir`
    reads one key per process)."""

    def __init__(self, store: Any, count: int) -> None:
        self.store, self.count = store, count

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def get(self, key: str) -> str | None:
        if not self.store.check([key]):
            return None
        return self.store.get(key).decode()

    def dir(self, prefix: str) -> dict[int, str]:
        found = {p: self.get(f"{prefix}{p}") for p in range(self.count)}
        return {p: v for p, v in found.items() if v is not None}


def environment_rank() -> Rank:
    """Before a process group exists: the plan of the environment (`kmp.topology()`)."""
    import os

    from keras_mgpu_plugins.cluster.topology import topology_from_env

    plan = topology_from_env(os.environ)
    return Rank(plan.worker_index, plan.num_workers, plan.is_chief)
