"""The cluster of a `TF_CONFIG` (its `"cluster"` object): parsed and checked, and a training
task's rank among the workers (`cluster.topology` reads the rest of the variable)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keras_mgpu_plugins.errors import TopologyError


def _check_parameter_server_cluster(cluster: Mapping[str, tuple[str, ...]]) -> None:
    """Raises unless a cluster with "ps" tasks has the chief and workers TensorFlow needs."""
    types = sorted(cluster)
    if len(cluster.get("chief", ())) != 1:
        raise TopologyError(
            'A parameter-server cluster (TF_CONFIG with "ps" tasks) needs exactly one "chief" '
            "task: the coordinator, which runs your script and sends the steps to the workers "
            "(TensorFlow's ParameterServerStrategy names it \"chief\"). Received: task types "
            f"{types}, chief={list(cluster.get('chief', ()))!r}. Add a \"chief\" address, or "
            'remove the "ps" tasks to train with all-reduce.')
    if not cluster.get("worker"):
        raise TopologyError(
            'A parameter-server cluster (TF_CONFIG with "ps" tasks) needs at least one '
            f'"worker" task to run the steps. Received: task types {types}.')


def worker_rank(task_type: str, task_id: int, has_chief: bool) -> int:
    """The rank of a training task among the job's workers: the chief first, then the workers.

    Args:
        task_type: `"chief"` or `"worker"`.
        task_id: The task's index within its type.
        has_chief: Whether the cluster has a `"chief"` task.

    Returns:
        0 for the chief; a worker's index, shifted by one behind a chief.
    """
    if task_type == "chief":
        return 0
    return task_id + (1 if has_chief else 0)


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


