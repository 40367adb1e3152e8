"""Who am I in the job: pure functions of the environment, no TensorFlow needed.

A `Topology` says how many workers the job has, which one this process is, and
whether it is the chief. It is computed from, in order of precedence:

1. `TF_CONFIG` (the variable every `tf.distribute` cluster resolver reads, and
   that Kubernetes operators, Ray Train and `kmp-launch` set);
2. the process-group variables `WORLD_SIZE` (> 1) and `RANK` (what `torchrun`, Kubernetes'
   PyTorchJob and many SLURM recipes set: `cluster.world`), before SLURM's, since
   `torchrun` under `srun` starts several processes in each task;
3. SLURM (`SLURM_NTASKS > 1` in a task that `srun` started: `SLURM_PROCID`, the
   step's task count and node list), building the cluster the same way
   TensorFlow's `SlurmClusterResolver` does;
4. Keras's own `KERAS_DISTRIBUTION_NUM_PROCESSES` / `_PROCESS_ID` / `_JOB_ADDRESSES`
   (what `keras.distribution.initialize` reads: a JAX job started by hand);
5. a single process, unless the active backend says this process joined a job by its own
   means (a torch process group the script initialised itself: `_backend.active().joined()`,
   asked only where Keras and its backend are already imported).

Every callback asks the runtime (`kmp.runtime.of(model)`), whose rank agrees with
this module, instead of reading the environment itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from keras_mgpu_plugins.cluster import world
from keras_mgpu_plugins.cluster.local_devices import gpus_from_env, local_device_names
from keras_mgpu_plugins.cluster.slurm import (
    DEFAULT_SLURM_PORT_BASE,
    SLURM_STEP_VARS,
    check_step,
    expand_hostlist,
    expand_tasks_per_node,
    slurm_fields,
)
from keras_mgpu_plugins.cluster.slurm import int_env as _int_env
from keras_mgpu_plugins.cluster.tf_cluster import (
    _check_parameter_server_cluster,
    _parse_cluster,
    worker_rank,
)
from keras_mgpu_plugins.errors import TopologyError

__all__ = ["DEFAULT_SLURM_PORT_BASE", "PS_REFUSAL", "SERVER_TASK_TYPES", "SLURM_STEP_VARS",
           "TRAINING_TASK_TYPES",
           "Topology", "TopologyError", "expand_hostlist", "expand_tasks_per_node",
           "gpus_from_env", "local_device_names", "topology", "topology_from_env", "worker_rank"]

#: Task types that take part in synchronous all-reduce training.
TRAINING_TASK_TYPES = ("chief", "worker")
#: Task types of a parameter-server cluster that serve (run TensorFlow's server, no user code).
SERVER_TASK_TYPES = ("worker", "ps")

#: Why an all-reduce strategy is refused on a cluster with "ps" tasks, and what to do instead
#: (`.format(strategy=...)`).
PS_REFUSAL = (
    'TF_CONFIG describes a parameter-server cluster (task type "ps"): its variables are meant '
    'to live on the "ps" tasks while the "chief" coordinates and the "worker" tasks run the '
    "steps, which strategy={strategy!r} cannot do (all-reduce keeps a copy of every variable "
    'on every worker and has no "ps" tasks). Use @kmp.parallelize(strategy="parameter_server") '
    '(or "auto", which picks it for such a cluster); for all-reduce, remove the "ps" tasks '
    'from the cluster and keep the "chief"/"worker" tasks.'
)


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process stands in a (possibly) distributed job.

    Attributes:
        num_workers: Number of processes that train together (chief and workers).
        worker_index: This process's rank among them, 0 for the chief.
        is_chief: Whether this process writes checkpoints, logs and uploads.
        task_type: `"chief"`, `"worker"`, `"ps"` or `"evaluator"`, or `None` for a
            single process.
        task_index: Index of this task within its task type.
        cluster_spec: Task type to list of `host:port`, or `None` for a single
            process.
        source: `"tf_config"`, `"slurm"`, `"keras"` (`KERAS_DISTRIBUTION_*`), `"torchrun"`
            (`WORLD_SIZE`/`RANK`), `"process_group"` (a torch process group started by the
            script itself) or `"local"`.
        local_devices: Names of this process's accelerators (`"GPU:0"`, ...), or
            of its logical CPU devices when it has no accelerator.
        num_ps: Number of parameter servers (`"ps"` tasks): 0 unless the cluster is a
            parameter-server cluster, in which the chief coordinates, the workers run
            the steps and the variables live on the parameter servers.
    """

    num_workers: int = 1
    worker_index: int = 0
    is_chief: bool = True
    task_type: str | None = None
    task_index: int = 0
    cluster_spec: Mapping[str, tuple[str, ...]] | None = None
    source: str = "local"
    local_devices: tuple[str, ...] = ()
    num_ps: int = 0

    @property
    def is_parameter_server_cluster(self) -> bool:
        """Whether the cluster has parameter servers (`"ps"` tasks)."""
        return self.num_ps > 0

    @property
    def serves(self) -> bool:
        """Whether this task only serves a parameter-server cluster (a `"worker"` or `"ps"`
        task there: TensorFlow's server runs the steps or holds variables; no user code)."""
        return self.is_parameter_server_cluster and self.task_type in SERVER_TASK_TYPES

    @property
    def is_multi_worker(self) -> bool:
        """Whether more than one process trains together."""
        return self.num_workers > 1

    @property
    def num_local_devices(self) -> int:
        """Number of devices this process drives (at least 1)."""
        return max(1, len(self.local_devices))

    def tf_config(self) -> dict[str, Any] | None:
        """The `TF_CONFIG` dictionary describing this topology, if distributed."""
        if self.cluster_spec is None or self.task_type is None:
            return None
        return {
            "cluster": {k: list(v) for k, v in self.cluster_spec.items()},
            "task": {"type": self.task_type, "index": self.task_index},
        }


def topology_from_env(
    env: Mapping[str, str], local_devices: Sequence[str] = ()
) -> Topology:
    """Computes the topology described by an environment mapping.

    Args:
        env: Environment variables, e.g. `os.environ`.
        local_devices: Names of this process's devices, passed through.

    Returns:
        The `Topology`.

    Raises:
        TopologyError: If `TF_CONFIG` or the SLURM variables are malformed.
    """
    devices = tuple(local_devices)
    if env.get("TF_CONFIG", "").strip():
        return _from_tf_config(env["TF_CONFIG"], devices)
    if world.describes_a_job(env):  # before SLURM: torchrun under srun starts several per task
        return Topology(**world.world_fields(env), local_devices=_own_device(env, devices))
    if _int_env(env, "SLURM_NTASKS", default=1) > 1 or _int_env(
        env, "SLURM_NPROCS", default=1
    ) > 1:
        fields = slurm_fields(env)
        if env is os.environ:  # the ancestry is this process's: only for its own variables
            check_step(env)
        return Topology(**fields, local_devices=devices)
    if _int_env(env, "KERAS_DISTRIBUTION_NUM_PROCESSES", default=1) > 1:
        return _from_keras(env, devices)
    return Topology(local_devices=devices)


def _own_device(env: Mapping[str, str], devices: tuple[str, ...]) -> tuple[str, ...]:
    """A process of a `torchrun`-style job drives one GPU, `GPU:LOCAL_RANK`, of those it sees."""
    index = world.local_rank(env)
    gpus = [d for d in devices if d.startswith("GPU:")]
    if index is None or len(gpus) <= 1:
        return devices
    return (gpus[index],) if index < len(gpus) else devices


def _from_keras(env: Mapping[str, str], devices: tuple[str, ...]) -> Topology:
    """The job `keras.distribution.initialize` would join (`KERAS_DISTRIBUTION_*`)."""
    count = _int_env(env, "KERAS_DISTRIBUTION_NUM_PROCESSES", default=1)
    index = _int_env(env, "KERAS_DISTRIBUTION_PROCESS_ID", default=-1)
    if not 0 <= index < count:
        raise TopologyError(
            f"KERAS_DISTRIBUTION_PROCESS_ID must be this process's index among the "
            f"KERAS_DISTRIBUTION_NUM_PROCESSES={count} processes (0 to {count - 1}). Received: "
            f"KERAS_DISTRIBUTION_PROCESS_ID={env.get('KERAS_DISTRIBUTION_PROCESS_ID')!r}")
    addresses = tuple(a.strip() for a in env.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "")
                      .split(",") if a.strip())
    cluster = {"worker": addresses} if len(addresses) == count else None
    return Topology(num_workers=count, worker_index=index, is_chief=index == 0,
                    task_type="worker", task_index=index, cluster_spec=cluster, source="keras",
                    local_devices=devices)


def topology() -> Topology:
    """The topology of this process, from `os.environ` and its devices.

    Reads the environment at each call (never cached at import), and lists
    devices without starting TensorFlow's runtime, so it is safe to call before
    a multi-worker strategy is created.

    Example:
        >>> import keras_mgpu_plugins as kmp
        >>> kmp.topology().num_workers
        1
    """
    found = topology_from_env(os.environ, local_device_names())
    if found.is_multi_worker:
        return found
    joined = _joined_by_backend()
    if joined is None:
        return found
    index, count = joined
    return Topology(num_workers=count, worker_index=index, is_chief=index == 0,
                    task_type="worker", task_index=index, source="process_group",
                    local_devices=found.local_devices)


def _joined_by_backend() -> tuple[int, int] | None:
    """The job the active backend joined by the script's own means, `(rank, count)`; asked
    only where Keras is imported already (never imported here)."""
    import sys

    if "keras" not in sys.modules:
        return None
    from keras_mgpu_plugins import _backend

    return _backend.active().joined()


# --- TF_CONFIG -------------------------------------------------------------------


def _from_tf_config(raw: str, devices: tuple[str, ...]) -> Topology:
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as err:
        raise TopologyError(
            f"TF_CONFIG is not valid JSON ({err.msg} at position {err.pos}). "
            f"Received: TF_CONFIG={raw!r}"
        ) from None
    if not isinstance(config, dict):
        raise TopologyError(f"TF_CONFIG must be a JSON object. Received: TF_CONFIG={raw!r}")
    cluster = _parse_cluster(config.get("cluster"), raw)
    task = config.get("task")
    if not isinstance(task, dict):
        raise TopologyError(
            'TF_CONFIG["task"] must be an object like {"type": "worker", "index": 0}. '
            f"Received: task={task!r}"
        )
    task_type = task.get("type")
    if task_type not in cluster:
        raise TopologyError(
            f'TF_CONFIG["task"]["type"] must be one of the cluster\'s task types '
            f"{sorted(cluster)}. Received: type={task_type!r}"
        )
    index = task.get("index", 0)
    if isinstance(index, str) and index.isdigit():
        index = int(index)
    if not isinstance(index, int) or isinstance(index, bool) or not (
        0 <= index < len(cluster[task_type])
    ):
        raise TopologyError(
            f'TF_CONFIG["task"]["index"] must be an integer in '
            f"[0, {len(cluster[task_type])}) for task type {task_type!r}. "
            f"Received: index={index!r}"
        )
    chiefs = cluster.get("chief", ())
    if "ps" in cluster:
        _check_parameter_server_cluster(cluster)
    workers = cluster.get("worker", ())
    if len(chiefs) > 1:
        raise TopologyError(
            f'TF_CONFIG["cluster"]["chief"] must list at most one address. '
            f"Received: chief={list(chiefs)!r}"
        )
    num_workers = len(chiefs) + len(workers)
    if task_type in TRAINING_TASK_TYPES:
        worker_index = worker_rank(task_type, index, bool(chiefs))
    else:  # an evaluator or other side task: not part of the all-reduce group
        worker_index = 0
    return Topology(
        num_workers=max(num_workers, 1),
        worker_index=worker_index,
        is_chief=task_type in TRAINING_TASK_TYPES and worker_index == 0,
        task_type=task_type,
        task_index=index,
        cluster_spec=cluster,
        source="tf_config",
        local_devices=devices,
        num_ps=len(cluster.get("ps", ())),
    )
