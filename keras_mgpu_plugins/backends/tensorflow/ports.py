"""Is this task's port free? Checked before TensorFlow binds it (it would abort)."""

from __future__ import annotations

from keras_mgpu_plugins.cluster.topology import Topology
from keras_mgpu_plugins.errors import StrategyError


def check_own_port_free(topo: Topology, force: bool = False) -> None:
    """Fails with the address when this worker's port is taken (TF would abort).

    Binds as gRPC's server does, with `SO_REUSEADDR`: connections of a previous
    run on the same port, left in TIME_WAIT (a relaunch on fixed ports), do not
    count; a socket listening on it does. It binds the wildcard address, as
    gRPC's server does (`[::]` / `0.0.0.0`, whatever host `TF_CONFIG` names):
    a probe of 127.0.0.1 misses a listener on another address of the host,
    which gRPC's bind then collides with. The probe never listens (a connection
    to it is refused) and is closed at once.
    """
    import socket

    if (not topo.is_multi_worker and not force) or topo.cluster_spec is None:
        return
    address = topo.cluster_spec[topo.task_type][topo.task_index]
    port = int(address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as err:
            raise StrategyError(
                f"Port {port} of this worker ({topo.task_type} {topo.task_index}, "
                f"address {address!r} from {topo.source}) is already in use ({err.strerror}). "
                "Stop the process that holds it, or give this task another port."
            ) from None
