"""The processes of a multi-process job (JAX's `jax.distributed` view), from the environment.

`KERAS_DISTRIBUTION_*` (what `keras.distribution.initialize` reads) first, else
`kmp.topology()` (TF_CONFIG as `kmp-launch` sets it, `torchrun`'s `WORLD_SIZE`/`RANK`/
`MASTER_ADDR`/`MASTER_PORT`, SLURM). No backend is imported.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

#: Keras's own variables (`keras.distribution.initialize` reads them).
KERAS_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
KERAS_NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
KERAS_PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"


class Plan(NamedTuple):
    """The processes the environment describes: coordinator, count, this one's id."""

    coordinator_address: str
    num_processes: int
    process_id: int
    source: str


def planned_processes(environ: Any = None) -> Plan | None:
    """The multi-process job the environment describes, or `None` for one process.

    `KERAS_DISTRIBUTION_*` first (Keras's names), else `kmp.topology()` (TF_CONFIG as
    `kmp-launch` sets it, SLURM): the coordinator is the first worker's address.
    """
    from keras_mgpu_plugins.cluster.topology import topology_from_env

    env = os.environ if environ is None else environ
    if env.get(KERAS_NUM_PROCESSES, "").strip():
        count = _int(env, KERAS_NUM_PROCESSES)
        if count <= 1:
            return None
        addresses = env.get(KERAS_ADDRESSES, "").split(",")
        if not addresses[0].strip():
            raise ValueError(f"{KERAS_NUM_PROCESSES}={count} needs {KERAS_ADDRESSES} (the "
                             "coordinator's host:port first). Received: "
                             f"{KERAS_ADDRESSES}={env.get(KERAS_ADDRESSES)!r}")
        return Plan(addresses[0].strip(), count, _int(env, KERAS_PROCESS_ID), "keras")
    plan = topology_from_env(env)
    if plan.source == "torchrun":  # the rank-0 store's address is the coordinator's
        from keras_mgpu_plugins.cluster import world

        address = world.master_address(env)
        if address is None:
            raise ValueError(f"{world.WORLD_SIZE}={plan.num_workers} needs {world.MASTER_ADDR} "
                             f"and {world.MASTER_PORT} (rank 0's host and a free port). "
                             f"Received: {world.MASTER_ADDR}={env.get(world.MASTER_ADDR)!r}, "
                             f"{world.MASTER_PORT}={env.get(world.MASTER_PORT)!r}")
        return Plan(address, plan.num_workers, plan.worker_index, plan.source)
    if not plan.is_multi_worker or plan.cluster_spec is None:
        return None
    cluster = plan.cluster_spec
    first = (cluster.get("chief") or cluster.get("worker"))[0]
    return Plan(first, plan.num_workers, plan.worker_index, plan.source)


def _int(env: Any, name: str) -> int:
    try:
        return int(env.get(name, ""))
    except ValueError:
        raise ValueError(f"{name} must be an integer. Received: {name}={env.get(name)!r}") from None
