"""examples/model_parallel.py runs as a user runs it (`--quick`) and does what it says."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "model_parallel.py"


def test_model_parallel_example_quick(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--quick"], capture_output=True,
                          text=True, timeout=360, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    assert result["recipe"] == {"/device:CPU:1": ["lstm"], "/device:CPU:2": ["lstm#2"],
                                "/device:CPU:0": ["concatenate", "dense"]}
    assert math.isfinite(result["recipe_loss"]) and math.isfinite(result["big_loss"])
    assert result["need"] == 2 * result["share"] or result["need"] == 2 * result["share"] + 1
    assert len(result["held"]) == 3 and result["big_changed"]
    assert all(size < result["share"] for size in result["held"].values())
    assert sum(result["held"].values()) == result["need"]  # measured slots = estimated
    assert result["bubble"] == pytest.approx(2 / 6)
    assert out.count("Placement (3 stages") == 2  # each model's report, printed once
