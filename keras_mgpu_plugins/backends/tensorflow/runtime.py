"""`TensorFlowRuntime`: `kmp.runtime` over a `tf.distribute` strategy.

The rank comes from the one source of "who am I" (`rank.whoami`: the
multi-worker strategy when there is one, else the environment); `all_gather`
is a sum all-reduce across the strategy's workers in which every other worker
contributes zeros to its slot (exact for every value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mgpu_plugins.backends.tensorflow import local_devices as _local_devices
from keras_mgpu_plugins.backends.tensorflow import rank as _rank
from keras_mgpu_plugins.runtime import Rank, Runtime


class TensorFlowRuntime(Runtime):
    """The runtime of the workers of `strategy` (default: the current strategy).

    Args:
        strategy: A `tf.distribute.Strategy`, or `None` for the current one.
    """

    def __init__(self, strategy: Any | None = None) -> None:
        self.strategy = strategy

    @classmethod
    def for_model(cls, model: Any | None) -> TensorFlowRuntime:
        """The runtime of the strategy `model` was built under (its `distribute_strategy`)."""
        return cls(getattr(model, "distribute_strategy", None) if model is not None else None)

    def rank(self) -> Rank:
        return _rank.whoami(self.strategy)

    @property
    def spans_workers(self) -> bool:
        return _rank.spans_workers(self.strategy)

    def store(self) -> Any:
        """The key-value store of TensorFlow's coordination service (`backends.tensorflow.store`),
        or `None` where the strategy spans one worker or TensorFlow offers none (one warning)."""
        if not self.spans_workers:
            return None
        from keras_mgpu_plugins.backends.tensorflow.store import coordination_store

        return coordination_store(self.num_workers)

    def scope(self) -> Any:
        import tensorflow as tf

        return (self.strategy or tf.distribute.get_strategy()).scope()

    def across_workers(self) -> TensorFlowRuntime:
        return TensorFlowRuntime(_rank.workers_strategy(self.strategy))

    def _gather(self, wire: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        strategy = self.strategy or tf.distribute.get_strategy()
        workers = _rank._workers_in(strategy)
        slots = np.zeros((workers, *wire.shape), dtype=wire.dtype)
        slots[_rank._task_rank(strategy)] = wire
        local = _rank.replicas_per_worker(strategy)
        zeros = np.zeros_like(slots)

        def value_fn(ctx: Any) -> Any:
            first_local = ctx.replica_id_in_sync_group % local == 0
            return tf.constant(slots if first_local else zeros)

        per_replica = strategy.experimental_distribute_values_from_function(value_fn)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()

    def describe(self) -> dict[str, Any]:
        """The strategy's public name, this worker's devices, the GPU models, TF's version."""
        import tensorflow as tf

        strategy = self.strategy or tf.distribute.get_strategy()
        described = {
            "strategy": tf_distribute_name(tf, strategy),
            "devices": strategy_devices(strategy),
            "gpu_models": _local_devices.gpu_models(),
            "tensorflow_version": tf.__version__,
        }
        if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            from keras_mgpu_plugins.backends.tensorflow.parameter_server import cluster

            # The chief alone runs fit (num_workers 1 for kmp's callbacks): the cluster's size.
            described.update(ps_workers=cluster.num_workers(), parameter_servers=cluster.num_ps())
        return described

    # --- the replicas of this worker (WeightSyncVerifier) --------------------------------
    @property
    def replicas_in_sync(self) -> int:
        """Replicas of the model across every worker (1 under TensorFlow's default strategy)."""
        import tensorflow as tf

        return int((self.strategy or tf.distribute.get_strategy()).num_replicas_in_sync)

    def track(self, variables: list, optimizer_vars: list, statistics: Sequence[str],
              key: tuple) -> Any:
        """This worker's per-replica copies of the variables to check, and their fingerprinter."""
        import tensorflow as tf

        from keras_mgpu_plugins.backends.tensorflow.replica_copies import Tracked

        return Tracked(self.strategy or tf.distribute.get_strategy(), variables, optimizer_vars,
                       statistics, key)


def apart(model: Any) -> str | None:
    """Why `model` would train apart from the job's other workers (`runtime.apart`): built
    under no strategy spanning them (`None` where its strategy does)."""
    import tensorflow as tf

    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    if _rank.spans_workers(strategy):
        return None
    name = tf_distribute_name(tf, strategy)
    built = ("under no strategy (TensorFlow's default)" if name == "default" else
             f"under a {name}, which spans this worker only")
    return ("on TensorFlow a model trains as one over several workers only when it is built "
            f"under the job's MultiWorkerMirroredStrategy, and this one was built {built}")


def tf_distribute_name(tf: Any, strategy: Any) -> str:
    """The `tf.distribute` class `strategy` is an instance of, by its public name
    (`"MirroredStrategy"`), or `"default"` for TensorFlow's default strategy."""
    for name in ("MultiWorkerMirroredStrategy", "MirroredStrategy", "OneDeviceStrategy", "TPUStrategy"):
        if isinstance(strategy, getattr(tf.distribute, name)):
            return name
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return "ParameterServerStrategy"
    return "default" if strategy is tf.distribute.get_strategy() else type(strategy).__name__


def strategy_devices(strategy: Any) -> list[str]:
    """This worker's devices under `strategy` (TF's default strategy: the first GPU, else CPU)."""
    try:
        return [str(d) for d in strategy.extended.worker_devices]
    except RuntimeError:  # "worker_devices() method unsupported by default" strategy
        return _local_devices.replica_devices()[:1]
