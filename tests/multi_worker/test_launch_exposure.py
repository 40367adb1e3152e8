"""What a local `kmp.launch` job listens on, read from /proc/net/tcp{,6} inside a worker.

TensorFlow's worker gRPC server binds the wildcard address (`0.0.0.0` / `[::]`) on the
port `TF_CONFIG` names, whatever host it names (docs/launch.md, "What a local job
exposes"). This test pins that down, so that it fails, and the docs get revisited, the
day TensorFlow binds loopback; and it checks that kmp itself listens on nothing but
loopback, in the workers and in the launcher, while the strategy is up.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys

import pytest

import keras_mgpu_plugins as kmp

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(180)]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """`0100007F` -> 127.0.0.1: /proc/net/tcp{,6} print each 32-bit word in host order."""
    raw = bytes.fromhex(hex_address)
    words = [raw[i:i + 4][::-1] if sys.byteorder == "little" else raw[i:i + 4]
             for i in range(0, len(raw), 4)]
    return ipaddress.ip_address(b"".join(words))


def listening_sockets() -> list[dict]:
    """Every listening TCP socket of this network namespace: address, port, inode."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)  # header
            for line in f:
                fields = line.split()
                if fields[3] != _LISTEN:
                    continue
                host, port = fields[1].split(":")
                found.append({"address": str(_address(host)), "port": int(port, 16),
                              "inode": int(fields[9]), "table": os.path.basename(table)})
    return found


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds open."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def what_is_bound() -> dict:
    """In a worker, strategy up: the listening sockets on the job's ports, and kmp's own."""
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow.strategy import get_strategy

    strategy = get_strategy("multi_worker")  # the one the bootstrap created
    config = json.loads(os.environ["TF_CONFIG"])
    ports = [int(a.rpartition(":")[2]) for a in config["cluster"]["worker"]]
    listening = listening_sockets()
    worker = socket_inodes(os.getpid())
    launcher = socket_inodes(os.getppid())
    own_port = ports[config["task"]["index"]]
    result = {
        "ports": ports,
        "on_job_ports": sorted({(s["port"], s["address"]) for s in listening
                                if s["port"] in ports}),
        # Listening sockets of this worker other than TensorFlow's server, and of the launcher.
        "worker_other": [s for s in listening if s["inode"] in worker and s["port"] != own_port],
        "launcher": [s for s in listening if s["inode"] in launcher],
    }
    # A collective after reading: no worker exits (closing its port) before the other has read.
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    result["replicas"] = int(total.numpy())
    return result


def test_tensorflow_binds_the_wildcard_and_kmp_only_loopback():
    results = kmp.launch(what_is_bound, num_workers=2, timeout=150)
    wildcard = {"0.0.0.0", "::"}
    for index, r in enumerate(results):
        assert r["replicas"] == 2
        # Each worker's gRPC port is listened on, on the wildcard address only. When this
        # fails because TensorFlow binds loopback, update docs/launch.md and this test.
        for port in r["ports"]:
            addresses = {address for p, address in r["on_job_ports"] if p == port}
            assert addresses and addresses <= wildcard, (
                f"worker {index}: port {port} listened on {sorted(addresses)}; TensorFlow "
                "2.x binds 0.0.0.0/[::] (docs/launch.md, 'What a local job exposes')")
        for s in r["worker_other"] + r["launcher"]:
            assert ipaddress.ip_address(s["address"]).is_loopback, (
                f"worker {index}: a socket of kmp listens on {s['address']}:{s['port']}, "
                f"beyond loopback: {r}")
