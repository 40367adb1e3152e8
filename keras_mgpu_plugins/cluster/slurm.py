"""A SLURM job step, read from the variables srun sets: pure parsing, no TensorFlow.

The cluster is built the way TensorFlow's `SlurmClusterResolver` builds it:
tasks numbered node by node, ports from `KMP_SLURM_PORT_BASE` (default 8888).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
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


#: The title slurmstepd gives itself: `slurmstepd: [JOB.STEP]`.
_STEPD = re.compile(r"slurmstepd: \[(\w+)\.(\w+)\]")
#: Set to `0` to skip `check_step` (a Python wrapper that srun starts on purpose).
STEP_CHECK_ENV = "KMP_SLURM_STEP_CHECK"
_checked: dict[tuple[int, str, str], str | None] = {}


def step_mismatch(env: Mapping[str, str],
                  ancestry: Sequence[tuple[int, str, bool]]) -> str | None:
    """Whether this process is not the srun task its SLURM variables describe (pure).

    Args:
        env: The process's environment.
        ancestry: `(pid, command line, has TensorFlow loaded)` of this process,
            then its parents, nearest first.

    Returns:
        The problem in words, or `None` when the evidence does not show one:
        no `slurmstepd` among the ancestors (a container, another launcher), or
        no step variables, or this process is the step's task (its direct
        child, or started through a wrapper that has not loaded TensorFlow: a
        shell, `conda run`, a Python launcher script).
    """
    found = next(((i, m) for i, (_, cmd, _) in enumerate(ancestry) if i
                  and (m := _STEPD.match(cmd.strip()))), None)
    if found is None:
        return None
    index, match = found
    running = f"{match.group(1)}.{match.group(2)}"
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    if not job or not step:
        return None
    pid, stepd_pid = ancestry[0][0], ancestry[index][0]
    if f"{job}.{step}" != running:
        return (f"this process (pid {pid}) runs in SLURM job step {running} (under "
                f"slurmstepd pid {stepd_pid}), but its SLURM variables describe step "
                f"{job}.{step} (SLURM_JOB_ID={job}, SLURM_STEP_ID={step}): they were "
                "inherited or copied from another step. Start each task with srun in "
                "the step that runs it, and do not export one step's SLURM_* variables "
                "to another.")
    trainers = [(p, cmd) for p, cmd, tensorflow in ancestry[1:index] if tensorflow]
    if trainers:
        parent_pid, parent_cmd = trainers[0]
        return (f"this process (pid {pid}) claims to be task SLURM_PROCID="
                f"{env.get('SLURM_PROCID')} of step {running}, but it was started by "
                f"a process of that task that runs TensorFlow (pid {parent_pid}: {parent_cmd[:120]!r}) "
                "and only inherited its SLURM variables; two processes would take the same "
                "worker's place. Remove SLURM_NTASKS and SLURM_PROCID from a subprocess's "
                f"environment, or, for a Python wrapper srun starts on purpose, set "
                f"{STEP_CHECK_ENV}=0.")
    return None


def check_step(env: Mapping[str, str]) -> None:
    """Raises `TopologyError` if this process is not the task its SLURM variables describe.

    Walks this process's parents with psutil (imported only here), once per process.
    """
    if env.get(STEP_CHECK_ENV) == "0":
        return
    key = (os.getpid(), str(env.get("SLURM_JOB_ID")), str(env.get("SLURM_STEP_ID")))
    if key not in _checked:
        import psutil

        ancestry = []
        for process in [psutil.Process(), *psutil.Process().parents()]:
            try:
                command = " ".join(process.cmdline()) or process.name()
            except psutil.Error:
                command = ""
            ancestry.append((process.pid, command, _loads_tensorflow(process.pid)))
        _checked[key] = step_mismatch(env, ancestry)
    if _checked[key] is not None:
        raise TopologyError(f"SLURM variables for a different task: {_checked[key]}")


def _loads_tensorflow(pid: int) -> bool:
    """Whether TensorFlow's library is mapped in process `pid` (False if unreadable)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any("_pywrap_tensorflow_internal" in line for line in maps)
    except OSError:
        return False
