"""examples/wandb_offline.py --quick runs offline on 2 devices and leaves one complete run."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keras_mgpu_plugins.integrations._wandb_records import find_runs, read_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wandb_offline.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb"),
]


def test_example_quick_leaves_one_offline_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TF_CONFIG"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"  # WANDB_MODE unset: the example must default to offline
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=220, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "runs: 1" in done.stdout
    (folder,) = find_runs(tmp_path)
    assert folder.name.startswith("offline-run-")
    run = read_run(folder)
    assert run.finished and run.project == "kmp-wandb-example"
    assert (run.config["strategy"], run.config["num_replicas"]) == ("MirroredStrategy", 2)
    assert [row["epoch"] for row in run.history if "epoch" in row] == [0, 1]
    assert any(key.startswith("host/") for key in run.history_keys)  # DeviceMetricsLogger's
    assert run.artifacts and {a["type"] for a in run.artifacts} == {"model"}
    best = tmp_path / "best.keras"
    digest = base64.b64encode(hashlib.md5(best.read_bytes()).digest()).decode()
    assert run.artifacts[-1]["files"] == {"best.keras": digest}
