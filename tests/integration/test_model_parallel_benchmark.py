"""benchmarks/model_parallel_memory.py runs (`--quick`): on CPU, the placed half, with Adam
(parameters + slots 1.5x a limit) and SGD (parameters alone 1.5x a limit)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "model_parallel_memory.py"


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_model_parallel_memory_quick(optimizer):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--limit-mb", "16",
                           "--steps", "1", "--optimizer", optimizer], capture_output=True,
                          text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines()
                             if ln.startswith("RESULT "))[7:])
    assert result["need_bytes"] == pytest.approx(1.5 * result["limit_bytes"], rel=0.02)
    assert result["optimizer"] == optimizer
    placed = result["cases"]["placed"]
    assert placed["trained"]
    per_device = placed["peak_bytes"] if result["on_gpu"] else placed["report_bytes"]
    assert len(per_device) == 2
    assert all(size < result["limit_bytes"] for size in per_device.values())
    if result["on_gpu"]:  # the unplaced model does not fit in one logical GPU
        assert not result["cases"]["unplaced"]["trained"]
