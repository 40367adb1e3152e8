"""A SLURM job step, read from the variables srun sets: pure parsing, no TensorFlow.

The cluster is built the way TensorFlow's `SlurmClusterResolver` builds it:
tasks numbered node by node, ports from `KMP_SLURM_PORT_BASE` (default 8888).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from keras_mgpu_plugins.errors import TopologyError

#: Port of the first task on each SLURM node, as in TensorFlow's resolver.
DEFAULT_SLURM_PORT_BASE = 8888

#: Set by srun in each task of a job step, never in an sbatch script itself.
SLURM_STEP_VARS = ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST")


def slurm_fields(env: Mapping[str, str]) -> dict[str, Any]:
    """The `Topology` fields (all but `local_devices`) of a task that srun started.

    Raises:
        TopologyError: For a batch script itself (not a task of a job step), or
            malformed SLURM variables.
    """
    ntasks = int_env(env, "SLURM_NTASKS", default=0) or int_env(env, "SLURM_NPROCS")
    if not any(name in env for name in SLURM_STEP_VARS):
        # The batch script itself (sbatch --ntasks=N), not one of srun's N tasks: as
        # worker 0 of N it would wait forever for workers nobody started.
        raise TopologyError(
            f"SLURM_NTASKS={ntasks}, but this process is not a task of a SLURM job step "
            f"(none of {', '.join(SLURM_STEP_VARS)} is set): start it with "
            f"`srun python ...` to train on {ntasks} workers, or with SLURM_NTASKS=1 set "
            "to train in this one process."
        )
    ntasks = int_env(env, "SLURM_STEP_NUM_TASKS", default=ntasks)
    procid = int_env(env, "SLURM_PROCID")
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
    port_base = int_env(env, "KMP_SLURM_PORT_BASE", default=DEFAULT_SLURM_PORT_BASE)
    addresses = []
    for node, count in zip(nodes, per_node, strict=True):
        addresses += [f"{node}:{port_base + i}" for i in range(count)]
    return {"num_workers": ntasks, "worker_index": procid, "is_chief": procid == 0,
            "task_type": "worker", "task_index": procid,
            "cluster_spec": {"worker": tuple(addresses)}, "source": "slurm"}


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


def int_env(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise TopologyError(f"{name} must be set to an integer.")
        return default
    try:
        return int(raw)
    except ValueError:
        raise TopologyError(f"{name} must be an integer. Received: {name}={raw!r}") from None
