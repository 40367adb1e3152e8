"""examples/wandb_offline.py runs offline and leaves the runs it says: one process, and 2 workers in group mode."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
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


def run_example(tmp_path, *args, **env_vars):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TF_CONFIG", "KMP_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", **env_vars)
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--dir", str(tmp_path), *args],
        capture_output=True, text=True, timeout=220, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def b64_md5(path):
    return base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode()


def test_example_quick_leaves_one_offline_run(tmp_path):
    done = run_example(tmp_path)  # WANDB_MODE unset: the example must default to offline
    assert "runs: 1" in done.stdout
    (folder,) = find_runs(tmp_path)
    assert folder.name.startswith("offline-run-")
    run = read_run(folder)
    assert run.finished and run.project == "kmp-wandb-example"
    assert (run.config["strategy"], run.config["num_replicas"]) == ("MirroredStrategy", 2)
    assert [row["epoch"] for row in run.history if "epoch" in row] == [0, 1]
    assert any(key.startswith("host/") for key in run.history_keys)  # DeviceMetricsLogger's
    assert run.artifacts and {a["type"] for a in run.artifacts} == {"model"}
    assert run.artifacts[-1]["files"] == {"best.keras": b64_md5(tmp_path / "best.keras")}


@pytest.mark.multi_worker
def test_example_two_workers_in_group_mode_leaves_one_run_per_worker_in_one_group(tmp_path):
    """The docs' comparison runs `--workers 2 --mode group`: 2 runs, one group, the chief's checkpoints."""
    done = run_example(tmp_path, "--workers", "2", "--mode", "group", WANDB_MODE="offline")
    assert "2 worker(s), 2 replicas, callbacks=kmp, mode=group" in done.stdout
    assert "runs: 2" in done.stdout
    runs = {run.name: run for run in map(read_run, find_runs(tmp_path))}
    assert sorted(runs) == ["run-worker0", "run-worker1"]
    groups = {run.group for run in runs.values()}
    assert len(groups) == 1 and re.fullmatch("[0-9a-f]{12}", groups.pop())  # kmp.launch's KMP_JOB_ID
    for index, run in enumerate(runs[f"run-worker{i}"] for i in (0, 1)):
        assert run.finished and run.project == "kmp-wandb-example"
        assert run.config["strategy"] == "MultiWorkerMirroredStrategy"
        assert (run.config["num_workers"], run.config["num_replicas"], run.config["worker_index"]) == (2, 2, index)
        epochs = [row for row in run.history if "epoch" in row]
        assert [row["epoch"] for row in epochs] == [0, 1]
        assert all(row["host/worker0/memory_mb"] > 0 and row["host/worker1/memory_mb"] > 0 for row in epochs)
    chief_run, other_run = runs["run-worker0"], runs["run-worker1"]
    assert [row["_step"] for row in chief_run.history if "epoch" in row] == [
        row["_step"] for row in other_run.history if "epoch" in row]
    assert other_run.artifacts == [] and chief_run.artifacts
    assert {a["type"] for a in chief_run.artifacts} == {"model"}
    assert chief_run.artifacts[-1]["files"] == {"best.keras": b64_md5(tmp_path / "best.keras")}
