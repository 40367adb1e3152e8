"""Runs `tests/torch/job.py` in fresh processes (torchrun's variables, `kmp-launch`, torchrun
itself) and loads what each returned."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import socket
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 150
_STRIPPED = ("KERAS_DISTRIBUTION_", "TF_CONFIG", "SLURM_", "KMP_", "WORLD_SIZE", "RANK",
             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "TORCHELASTIC_")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: Kept: the canary runs the suite against keras-nightly with unchecked versions allowed.
_KEPT = ("KMP_ALLOW_UNCHECKED_VERSIONS",)


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED) or k in _KEPT}
    env.update(KERAS_BACKEND="torch", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               CUDA_VISIBLE_DEVICES="", **extra)
    return env


def command(target: str, out: pathlib.Path, kwargs: dict | None = None) -> list[str]:
    return [sys.executable, "-m", "tests.torch.job", target, str(out), json.dumps(kwargs or {})]


def start(target: str, out: pathlib.Path, kwargs: dict | None = None,
          **extra: str) -> subprocess.Popen:
    return subprocess.Popen(command(target, out, kwargs), cwd=ROOT, env=environment(**extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(processes: list[subprocess.Popen], outs: list[pathlib.Path],
           timeout: float = TIMEOUT, ok: bool = True) -> list:
    """Waits for every process (killing all on a timeout); what each returned, in order
    (`{"error": ...}` for one that raised: asserted absent when `ok`)."""
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=timeout)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    results = []
    for process, out, log in zip(processes, outs, logs, strict=True):
        if ok:
            assert process.returncode == 0, log[-4000:]
        result = pickle.loads(out.read_bytes()) if out.exists() else {"error": "no result"}
        if isinstance(result, dict):
            result.setdefault("log", log)
        results.append(result)
    return results


def run_processes(tmp_path: pathlib.Path, target: str, kwargs: dict | None = None,
                  n: int = 2, ok: bool = True, **extra: str) -> list:
    """`target` in `n` processes started as torchrun starts them (its variables set)."""
    port = str(free_port())
    outs = [tmp_path / f"rank{i}.pkl" for i in range(n)]
    processes = [start(target, outs[i], kwargs, WORLD_SIZE=str(n), RANK=str(i),
                       LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port, **extra) for i in range(n)]
    return finish(processes, outs, ok=ok)


def run_one(tmp_path: pathlib.Path, target: str, kwargs: dict | None = None, **extra: str):
    """`target` in one process (the one-device reference)."""
    out = tmp_path / "one.pkl"
    return finish([start(target, out, kwargs, **extra)], [out])[0]


def max_diff(a: list, b: list) -> float:
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(a, b, strict=True))
