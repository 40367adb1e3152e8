"""Who am I in the job: pure functions of the environment, no TensorFlow needed.

A `Topology` says how many workers the job has, which one this process is, and
whether it is the chief. It is computed from, in order of precedence:

1. `TF_CONFIG` (the variable every `tf.distribute` cluster resolver reads, and
   that Kubernetes operators, Ray Train and `kmp-launch` set);
2. SLURM (`SLURM_NTASKS > 1` in a task that `srun` started: `SLURM_PROCID`, the
   step's task count and node list), building the cluster the same way
   TensorFlow's `SlurmClusterResolver` does;
3. a single process.

Every callback asks this module (through `keras_mgpu_plugins.collective`)
instead of reading the environment itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

#: Task types that take part in synchronous all-reduce training.
TRAINING_TASK_TYPES = ("chief", "worker")

#: Port of the first task on each SLURM node, as in TensorFlow's resolver.
DEFAULT_SLURM_PORT_BASE = 8888


#: Why a cluster with "ps" tasks is refused, and what to do instead.
PS_REFUSAL = (
    'TF_CONFIG describes a parameter-server cluster (task type "ps"), which Keras 3 cannot '
    "train: its Model.fit refuses ParameterServerStrategy (keras-team/keras#18624), so "
    "building one yourself does not help either. Train with synchronous all-reduce "
    "instead: remove the \"ps\" tasks from the cluster and keep the \"chief\"/\"worker\" "
    "tasks; kmp then creates a MultiWorkerMirroredStrategy over them "
    "(@kmp.parallelize, or kmp.launch on one machine)."
)


class TopologyError(ValueError):
    """The environment describes a cluster that cannot be used."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process stands in a (possibly) distributed job.

    Attributes:
        num_workers: Number of processes that train together (chief and workers).
        worker_index: This process's rank among them, 0 for the chief.
        is_chief: Whether this process writes checkpoints, logs and uploads.
        task_type: `"chief"`, `"worker"` or `"evaluator"`, or `None` for a
            single process.
        task_index: Index of this task within its task type.
        cluster_spec: Task type to list of `host:port`, or `None` for a single
            process.
        source: `"tf_config"`, `"slurm"` or `"local"`.
        local_devices: Names of this process's accelerators (`"GPU:0"`, ...), or
            of its logical CPU devices when it has no accelerator.
    """

    num_workers: int = 1
    worker_index: int = 0
    is_chief: bool = True
    task_type: str | None = None
    task_index: int = 0
    cluster_spec: Mapping[str, tuple[str, ...]] | None = None
    source: str = "local"
    local_devices: tuple[str, ...] = ()

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
    if _int_env(env, "SLURM_NTASKS", default=1) > 1 or _int_env(
        env, "SLURM_NPROCS", default=1
    ) > 1:
        return _from_slurm(env, devices)
    return Topology(local_devices=devices)


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
    return topology_from_env(os.environ, local_device_names())


def local_device_names() -> tuple[str, ...]:
    """This process's GPUs, else its (logical) CPUs, without starting TF's runtime.

    Before TensorFlow is imported (importing it costs seconds) the environment
    answers where it can, and then no logical devices can be configured yet:
    `CUDA_VISIBLE_DEVICES` gives `GPU:0..n-1` (or `CPU:0` when it hides every
    GPU), and a Linux machine with no GPU driver (no `/proc/driver/nvidia/gpus`,
    `/dev/nvidia<N>` or `/dev/kfd`) gives `CPU:0`. Otherwise, or once TensorFlow
    is imported, TensorFlow's visible and logical devices answer.
    """
    import sys

    if "tensorflow" not in sys.modules:
        gpus = gpus_from_env(os.environ, _has_gpu_driver())
        if gpus is not None:
            return tuple(f"GPU:{i}" for i in range(gpus)) or ("CPU:0",)
    import tensorflow as tf

    gpus = tf.config.get_visible_devices("GPU")  # simulate_devices hides all GPUs but one
    if gpus:
        logical = _logical_count(tf, gpus)
        return tuple(f"GPU:{i}" for i in range(logical))
    cpus = tf.config.list_physical_devices("CPU")
    return tuple(f"CPU:{i}" for i in range(_logical_count(tf, cpus[:1])))


def gpus_from_env(env: Mapping[str, str], driver: bool | None) -> int | None:
    """How many GPUs the environment alone gives this process, or `None` if it cannot say.

    Args:
        env: Environment variables.
        driver: Whether the machine has a GPU driver (`None`: unknown).

    Returns:
        0 without a driver; else the GPUs `CUDA_VISIBLE_DEVICES` lists (CUDA
        stops at the first `-1` or empty entry); `None` when it is unset.
    """
    if driver is False:
        return 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    count = 0
    for entry in visible.split(","):
        if entry.strip() in ("", "-1"):
            break
        count += 1
    return count


def _has_gpu_driver() -> bool | None:
    """Whether a GPU driver is present (Linux: NVIDIA or ROCm devices); `None` elsewhere."""
    import glob
    import sys

    if not sys.platform.startswith("linux"):
        return None
    return bool(os.path.isdir("/proc/driver/nvidia/gpus") or glob.glob("/dev/nvidia[0-9]*")
                or os.path.exists("/dev/kfd"))


def _logical_count(tf: Any, physical: list) -> int:
    count = 0
    for device in physical:
        configured = tf.config.get_logical_device_configuration(device)
        count += len(configured) if configured else 1
    return count


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
    if "ps" in cluster:
        raise TopologyError(
            PS_REFUSAL + f" Received: ps={list(cluster['ps'])!r}"
        )
    chiefs = cluster.get("chief", ())
    workers = cluster.get("worker", ())
    if len(chiefs) > 1:
        raise TopologyError(
            f'TF_CONFIG["cluster"]["chief"] must list at most one address. '
            f"Received: chief={list(chiefs)!r}"
        )
    num_workers = len(chiefs) + len(workers)
    if task_type in TRAINING_TASK_TYPES:
        worker_index = index if task_type == "chief" else len(chiefs) + index
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
    )


def _parse_cluster(cluster: Any, raw: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(cluster, dict) or not cluster:
        raise TopologyError(
            'TF_CONFIG["cluster"] must be a non-empty object mapping task types to '
            f"lists of \"host:port\". Received: cluster={cluster!r}"
        )
    parsed = {}
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses:
            raise TopologyError(
                f'TF_CONFIG["cluster"][{task_type!r}] must be a non-empty list of '
                f'"host:port" strings. Received: {addresses!r}'
            )
        for address in addresses:
            if not isinstance(address, str) or not _is_host_port(address):
                raise TopologyError(
                    f'TF_CONFIG["cluster"][{task_type!r}] holds an address that is not '
                    f'"host:port" with a port in [1, 65535]. Received: {address!r}'
                )
        parsed[task_type] = tuple(addresses)
    return parsed


def _is_host_port(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


# --- SLURM -------------------------------------------------------------------------


#: Set by srun in each task of a job step, never in an sbatch script itself.
SLURM_STEP_VARS = ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST")


def _from_slurm(env: Mapping[str, str], devices: tuple[str, ...]) -> Topology:
    ntasks = _int_env(env, "SLURM_NTASKS", default=0) or _int_env(env, "SLURM_NPROCS")
    if not any(name in env for name in SLURM_STEP_VARS):
        # The batch script itself (sbatch --ntasks=N), not one of srun's N tasks: as
        # worker 0 of N it would wait forever for workers nobody started.
        raise TopologyError(
            f"SLURM_NTASKS={ntasks}, but this process is not a task of a SLURM job step "
            f"(none of {', '.join(SLURM_STEP_VARS)} is set): start it with "
            f"`srun python ...` to train on {ntasks} workers, or with SLURM_NTASKS=1 set "
            "to train in this one process."
        )
    ntasks = _int_env(env, "SLURM_STEP_NUM_TASKS", default=ntasks)
    procid = _int_env(env, "SLURM_PROCID")
    if not 0 <= procid < ntasks:
        raise TopologyError(
            f"SLURM_PROCID must be in [0, SLURM_NTASKS={ntasks}). Received: "
            f"SLURM_PROCID={procid}"
        )
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise TopologyError(
            "SLURM_NTASKS > 1 but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST "
            "is set; start the job step with srun."
        )
    nodes = expand_hostlist(nodelist)
    per_node_raw = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node_raw:
        per_node = expand_tasks_per_node(per_node_raw)
    else:
        per_node = [ntasks // len(nodes)] * len(nodes)
    if len(per_node) != len(nodes) or sum(per_node) != ntasks:
        raise TopologyError(
            f"SLURM's node list ({nodelist!r}: {len(nodes)} nodes) and tasks per node "
            f"({per_node_raw!r}) do not add up to SLURM_NTASKS={ntasks}."
        )
    port_base = _int_env(env, "KMP_SLURM_PORT_BASE", default=DEFAULT_SLURM_PORT_BASE)
    addresses = []
    for node, count in zip(nodes, per_node, strict=True):
        addresses += [f"{node}:{port_base + i}" for i in range(count)]
    return Topology(
        num_workers=ntasks,
        worker_index=procid,
        is_chief=procid == 0,
        task_type="worker",
        task_index=procid,
        cluster_spec={"worker": tuple(addresses)},
        source="slurm",
        local_devices=devices,
    )


_HOSTLIST_ITEM = re.compile(r"([^,\[]+)(\[[^\]]*\])?([^,\[]*)")


def expand_hostlist(hostlist: str) -> list[str]:
    """Expands a SLURM host list such as `"gpu[01-03,07],login1"`.

    Args:
        hostlist: A compressed SLURM host list.

    Returns:
        The host names, in order.

    Raises:
        TopologyError: If a range is malformed.
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        match = _HOSTLIST_ITEM.fullmatch(item)
        if not match:
            raise TopologyError(f"Malformed SLURM host list. Received: {hostlist!r}")
        prefix, ranges, suffix = match.groups()
        if not ranges:
            hosts.append(prefix + suffix)
            continue
        for part in ranges[1:-1].split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise TopologyError(f"Malformed SLURM host range {part!r} in {hostlist!r}")
            hi = hi or lo
            if int(hi) < int(lo):
                raise TopologyError(f"Decreasing SLURM host range {part!r} in {hostlist!r}")
            width = len(lo)
            hosts += [f"{prefix}{n:0{width}d}{suffix}" for n in range(int(lo), int(hi) + 1)]
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise TopologyError(f"Unbalanced brackets in SLURM host list. Received: {text!r}")
    return [item for item in items + [current] if item]


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expands SLURM's tasks per node, e.g. `"2(x3),1"` → `[2, 2, 2, 1]`."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise TopologyError(f"Malformed SLURM tasks per node. Received: {spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _int_env(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise TopologyError(f"{name} must be set to an integer.")
        return default
    try:
        return int(raw)
    except ValueError:
        raise TopologyError(f"{name} must be an integer. Received: {name}={raw!r}") from None
