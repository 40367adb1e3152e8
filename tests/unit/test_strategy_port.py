"""The worker-port probe: a port in TIME_WAIT is free (gRPC binds it), a listening one is not."""

from __future__ import annotations

import socket

import pytest

from keras_mgpu_plugins.backends.tensorflow.strategy import StrategyError, _check_own_port_free
from keras_mgpu_plugins.topology import Topology


def topo_on(port: int) -> Topology:
    return Topology(num_workers=2, worker_index=0, is_chief=True, task_type="worker", task_index=0,
                    cluster_spec={"worker": (f"localhost:{port}", "localhost:1")}, source="tf_config")


def time_wait_port() -> int:
    """A port whose only socket is in TIME_WAIT: a gRPC-like server closed its connection first."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's server does
    listener.bind(("localhost", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("localhost", port))
    accepted, _ = listener.accept()
    accepted.close()  # the side that closes first keeps TIME_WAIT on (port, client's port)
    client.recv(1)
    client.close()
    listener.close()
    return port


def test_port_left_in_time_wait_by_a_previous_run_is_free():
    port = time_wait_port()
    with socket.socket() as naive:  # what the probe did before: no SO_REUSEADDR, and it failed
        with pytest.raises(OSError):
            naive.bind(("", port))
    _check_own_port_free(topo_on(port))  # no error: gRPC (SO_REUSEADDR) binds it too


def test_port_held_by_a_listening_socket_is_named():
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's own listener
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(StrategyError, match=f"Port {port} of this worker .* already in use"):
            _check_own_port_free(topo_on(port))


def non_loopback_ipv4() -> str | None:
    import ipaddress

    import psutil

    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


def test_port_held_on_another_address_of_the_host_is_named():
    """Why the probe binds the wildcard, not 127.0.0.1: gRPC binds [::] and would collide."""
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind((address, 0))
        held.listen()
        port = held.getsockname()[1]
        with socket.socket() as loopback_probe:  # a loopback-only probe would call it free
            loopback_probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            loopback_probe.bind(("127.0.0.1", port))
        with pytest.raises(StrategyError, match=f"Port {port} of this worker .* already in use"):
            _check_own_port_free(topo_on(port))
