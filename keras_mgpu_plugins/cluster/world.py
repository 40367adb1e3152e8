"""A job described by the process-group variables: `WORLD_SIZE`, `RANK`, `LOCAL_RANK`,
`MASTER_ADDR`, `MASTER_PORT`. Pure parsing, no backend import.

These are the names `torchrun` (and `torch.distributed.run`) sets in each process it
starts, that Kubernetes' PyTorchJob sets in each pod, and that many SLURM recipes export
before `srun`: a process that finds them is rank `RANK` of `WORLD_SIZE` processes, and
the one with rank 0 holds the job's store at `MASTER_ADDR:MASTER_PORT`. kmp reads them
on every backend (`kmp.topology()`), and sets them for the processes it starts or joins
on the torch backend, so a script written for `torchrun` runs unchanged under
`kmp-launch` or `srun`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keras_mgpu_plugins.errors import TopologyError

WORLD_SIZE, RANK, LOCAL_RANK = "WORLD_SIZE", "RANK", "LOCAL_RANK"
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT = "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"
#: Every variable of the group, in the order a launcher sets them.
VARIABLES = (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)


def describes_a_job(env: Mapping[str, str]) -> bool:
    """Whether `env` describes several processes through `WORLD_SIZE` (> 1)."""
    raw = env.get(WORLD_SIZE, "").strip()
    return raw.isdigit() and int(raw) > 1


def world_fields(env: Mapping[str, str]) -> dict[str, Any]:
    """The `Topology` fields (all but `local_devices`) of a process of such a job.

    Raises:
        TopologyError: Without a valid `RANK` for this process.
    """
    count = int(env[WORLD_SIZE])
    raw = env.get(RANK, "").strip()
    if not raw.isdigit() or not int(raw) < count:
        raise TopologyError(
            f"{WORLD_SIZE}={count} describes a job of {count} processes, but {RANK} (this "
            f"process's rank, 0 to {count - 1}) is {env.get(RANK)!r}. Start the processes with "
            "torchrun (or kmp-launch, srun), which set both, or unset WORLD_SIZE to train in "
            f"one process. Received: {RANK}={env.get(RANK)!r}")
    rank = int(raw)
    return {"num_workers": count, "worker_index": rank, "is_chief": rank == 0,
            "task_type": "worker", "task_index": rank, "cluster_spec": None,
            "source": "torchrun"}


def local_rank(env: Mapping[str, str]) -> int | None:
    """`LOCAL_RANK` (else SLURM's `SLURM_LOCALID`): this process's index on its host."""
    for name in (LOCAL_RANK, "SLURM_LOCALID"):
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def master_address(env: Mapping[str, str]) -> str | None:
    """`MASTER_ADDR:MASTER_PORT`, where both are set."""
    host, port = env.get(MASTER_ADDR, "").strip(), env.get(MASTER_PORT, "").strip()
    return f"{host}:{port}" if host and port.isdigit() else None


def variables_for(coordinator: str, count: int, rank: int, local: int,
                  local_count: int) -> dict[str, str]:
    """The variables of process `rank` of `count`, whose rank-0 store is at `coordinator`
    (`host:port`), `local` of `local_count` processes on its host."""
    host, _, port = coordinator.rpartition(":")
    return {WORLD_SIZE: str(count), RANK: str(rank), LOCAL_RANK: str(local),
            LOCAL_WORLD_SIZE: str(local_count), MASTER_ADDR: host.strip("[]"),
            MASTER_PORT: port}


def local_position(addresses: tuple[str, ...], rank: int) -> tuple[int, int]:
    """This process's index among the processes on its host, and their count (the hosts of
    a cluster's `host:port` addresses, in rank order)."""
    hosts = [a.rpartition(":")[0] for a in addresses]
    mine = hosts[rank]
    return hosts[:rank].count(mine), hosts.count(mine)
