"""Who am I in the running job: the one source of rank, world size and chief.

Private; `keras_mgpu_plugins.collective` re-exports what callbacks use
(`whoami`, `is_chief`, `worker_index`, `num_workers`, `spans_workers`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from keras_mgpu_plugins.cluster.topology import topology_from_env, worker_rank
from keras_mgpu_plugins.errors import TopologyError
from keras_mgpu_plugins.runtime._base import Rank


def whoami(strategy: Any | None = None) -> Rank:
    """This process's rank, number of workers and chief flag, read at call time.

    The one answer to "who am I", in this order:

    1. A multi-worker strategy (`strategy` if it spans workers, else the
       current one, else the one this process created or used: TensorFlow
       allows one per process) ranks the workers by its cluster resolver, as
       its collectives do.
    2. Else, a process that chose a single-worker strategy through kmp
       (`strategy="default"` or `"mirrored"`, or an instance that spans one
       worker) trains alone and is its own chief, whatever `TF_CONFIG` or
       SLURM describe (`srun -n 4` of such a script: four independent runs,
       each writing its own files).
    3. Else (no strategy chosen yet) the environment's plan (`kmp.topology()`).

    Raises:
        TopologyError: If the environment (`TF_CONFIG`, SLURM) describes a
            multi-worker job in which this process has another rank, or which
            has another number of workers, than in its multi-worker strategy;
            or if the environment is malformed.
    """
    found = _spanning(strategy)
    if found is not None:
        rank, workers = _task_rank(found), _workers_in(found)
        check_env_agrees(rank, workers)
        return Rank(rank, workers, rank == 0)
    if _alone[0]:
        return Rank(0, 1, True)
    env = topology_from_env(os.environ)
    return Rank(env.worker_index, env.num_workers, env.is_chief)


def note_strategy(strategy: Any) -> None:
    """Records the strategy kmp gave this process: the source of `whoami` from now on.

    Raises:
        TopologyError: If it spans workers and the environment disagrees with it.
    """
    if spans_workers(strategy):
        whoami(strategy)
    else:
        _alone[0] = True


def check_env_agrees(rank: int, workers: int) -> None:
    """Raises `TopologyError` if the environment gives this worker another rank or job size."""
    env = topology_from_env(os.environ)
    if env.is_multi_worker and (env.worker_index, env.num_workers) != (rank, workers):
        raise TopologyError(
            f"This process is worker {rank} of {workers} in its multi-worker strategy (its "
            f"cluster resolver), but worker {env.worker_index} of {env.num_workers} in the "
            f"environment ({env.source}: {_env_names(env.source)}). Files, logs and "
            "collectives would follow different ranks: make the two describe the same job "
            "(or unset the environment's cluster variables when passing your own "
            "cluster_resolver)."
        )


def _env_names(source: str) -> str:
    return "TF_CONFIG" if source == "tf_config" else "SLURM_PROCID, SLURM_NTASKS"


def _spanning(strategy: Any | None) -> Any | None:
    """The multi-worker strategy this process trains in, or `None`."""
    if "tensorflow" not in sys.modules:  # no strategy can exist yet: stay cheap
        return None
    import tensorflow as tf

    for candidate in (strategy, tf.distribute.get_strategy(), _process_strategy[0]):
        if candidate is not None and spans_workers(candidate):
            return candidate
    return None


def workers_strategy(strategy: Any) -> Any:
    """The strategy to gather across workers with: `strategy` if it spans them, else this
    process's multi-worker strategy if one exists, else `strategy` (never creates one)."""
    return _spanning(strategy) or strategy


#: The multi-worker strategy this process trains in, once created or seen (TensorFlow
#: allows one per process); a one-element list, so that tests can reset it.
_process_strategy: list[Any] = [None]
#: Whether kmp gave this process a single-worker strategy (it trains alone).
_alone: list[bool] = [False]


def forget_for_tests() -> None:
    """Forgets the strategy kmp gave this process (tests only)."""
    _process_strategy[0], _alone[0] = None, False


def spans_workers(strategy: Any | None = None) -> bool:
    """Whether `strategy` (default: the current one) communicates across workers.

    A strategy that does becomes this process's multi-worker strategy (`whoami`).
    """
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    if _workers_in(strategy) <= 1:
        return False
    _process_strategy[0] = strategy
    return True


def strategy_name(strategy: Any) -> str:
    """The public name of `strategy`'s class (TensorFlow's multi-worker class is named otherwise)."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__


def replicas_per_worker(strategy: Any) -> int:
    """How many of `strategy`'s replicas each worker holds (its devices)."""
    return len(strategy.extended.worker_devices)


def _workers_in(strategy: Any) -> int:
    return strategy.num_replicas_in_sync // replicas_per_worker(strategy)


def _task_rank(strategy: Any) -> int:
    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec().as_dict()
    return worker_rank(resolver.task_type, int(resolver.task_id), bool(spec.get("chief")))
