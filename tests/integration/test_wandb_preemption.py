"""One W&B run through preemption: a 2-worker job stopped by SIGTERM and run again continues
the same run, its steps monotonic; read back from wandb's offline run files.

`tests/scripts/wandb_preempt.py` trains under `kmp-launch -n 2` with `BackupAndRestore`,
`DeviceMetricsLogger` and `WandbLogger` (offline, batch logs every batch). Worker 1 sends
itself SIGTERM after batch 2 of epoch 2: every worker stops there, saved (exit 75). The same
command again resumes, or `--max-restarts 1` does it within one launch. Either way the two
runs' files carry one run id, and the second logs no step the first had logged.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from keras_mgpu_plugins.integrations._wandb_records import find_runs, read_run

pytestmark = [
    pytest.mark.multi_worker,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb"),
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tests" / "scripts" / "wandb_preempt.py"
STEPS, EPOCHS = 6, 3  # 96 rows, global batch 16


def launch(tmp_path, *script_options, options=()):
    pythonpath = filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), "WANDB_MODE": "offline",
               "WANDB_SILENT": "true"}
    environ.pop("KMP_JOB_ID", None)  # a rerun by hand is a new launch, with a new job id
    command = [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2", "--timeout", "280",
               *options, str(SCRIPT), str(tmp_path / "backup"), str(tmp_path / "wandb"),
               *script_options]
    done = subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stderr


def runs(tmp_path):
    found = [read_run(path) for path in find_runs(tmp_path / "wandb")]
    return sorted(found, key=lambda run: run.path.parent.name)  # offline-run-<time>-<id>


def steps(run):
    return [row["_step"] for row in run.history]


def check_one_run_continued(first, second):
    assert first.id == second.id and first.id.startswith("kmp-")
    assert steps(first) == sorted(steps(first)) and steps(second) == sorted(steps(second))
    assert max(steps(first)) < min(steps(second)), (steps(first), steps(second))
    # stopped in epoch 2 after its batch 2 (step 9; the stop is raised before WandbLogger's
    # batch-end hook of that batch): the rerun trains from its batch 3 (step 10) on
    assert STEPS + 2 <= max(steps(first)) <= STEPS + 3
    assert min(steps(second)) == STEPS + 4
    assert max(steps(second)) == STEPS * EPOCHS
    every = first.history_keys | second.history_keys
    for worker in (0, 1):  # per-worker system metrics and phases, labelled by worker
        assert {f"host/worker{worker}/memory_mb", f"phase/worker{worker}/host_ms",
                f"phase/worker{worker}/compute_ms"} <= every
    assert {"straggler/worker", "straggler/phase", "flops/per_step"} <= every
    epochs = [row["epoch"] for run in (first, second) for row in run.history if "epoch" in row]
    assert epochs == [0, 1, 2]


def test_a_job_stopped_and_run_again_continues_the_same_wandb_run(tmp_path):
    code, err = launch(tmp_path, "--signal-at", "1:2:1")
    assert code == 75, err[-3000:]
    assert (tmp_path / "backup" / "wandb_run.json").exists()
    code, err = launch(tmp_path)
    assert code == 0, err[-3000:]
    found = runs(tmp_path)
    assert len(found) == 2, [r.path for r in found]
    check_one_run_continued(*found)
    assert not (tmp_path / "backup").exists()  # training completed: the record went with it


def test_a_job_restarted_by_max_restarts_continues_the_same_wandb_run(tmp_path):
    code, err = launch(tmp_path, "--signal-at", "1:2:1", options=("--max-restarts", "1"))
    assert code == 0, err[-3000:]
    assert "restart 1 of 1" in err
    found = runs(tmp_path)
    assert len(found) == 2, [r.path for r in found]
    check_one_run_continued(*found)
