"""Runs `tests/jax/program.py` in fresh processes and loads what they measured."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 120


def simulated_devices(n: int = 2) -> dict[str, str]:
    """The environment of a process that sees `n` simulated CPU devices."""
    return {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(n),
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KERAS_DISTRIBUTION_", "TF_CONFIG", "SLURM_", "KMP_"))}
    env.update(KERAS_BACKEND="jax", PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.update(extra)
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env.pop("XLA_FLAGS", None)
    return env


def start(case: str, out: pathlib.Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.jax.program", case, str(out)],
                            cwd=ROOT, env=environment(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(processes: list[subprocess.Popen], outs: list[pathlib.Path],
           timeout: float = TIMEOUT) -> list[dict]:
    """Waits for every process (killing all on a timeout); their results, in order."""
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=timeout)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, log in zip(processes, logs, strict=True):
        assert process.returncode == 0, log[-3000:]
    return [dict(np.load(out)) for out in outs]


def run_two_processes(tmp_path: pathlib.Path, case: str = "processes") -> list[dict]:
    port = free_port()
    outs = [tmp_path / f"process{i}.npz" for i in range(2)]
    processes = [start(case, outs[i], KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                       KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(i))
                 for i in range(2)]
    return finish(processes, outs)


def run_one(tmp_path: pathlib.Path, case: str) -> dict:
    out = tmp_path / f"{case}.npz"
    return finish([start(case, out)], [out])[0]


def weight_keys(results: dict, prefix: str = "w") -> list[str]:
    return sorted(k for k in results if k.startswith(prefix) and k[len(prefix):].isdigit())
