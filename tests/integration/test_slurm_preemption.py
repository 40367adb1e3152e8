"""SLURM's stop signal and `scontrol requeue` on a real SLURM (localhost), with BackupAndRestore.

Needs running SLURM daemons whose `sinfo` answers (`tests/integration/slurm_localhost.sh`,
with `JobRequeue=1` or `#SBATCH --requeue`); skipped, with the reason, where none answer.

The batch script is docs/preemption.md's recipe: `srun python -m keras_mgpu_plugins.run`
trains (2 tasks, `tests/scripts/preempt.py`); SIGUSR1 reaches every task (`scancel
--signal=USR1`, the delivery `#SBATCH --signal=USR1@90` makes before the time limit);
the tasks stop at one agreed step with the backup written and exit with 75; the batch
script requeues the job (`scontrol requeue`); the requeued job (`SLURM_RESTART_COUNT=1`)
resumes mid-epoch and ends with the weights of an uninterrupted job, bit for bit.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.integration.test_slurm import _MISSING

pytestmark = [
    pytest.mark.slurm, pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(900),
    pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING)),
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tests" / "scripts" / "preempt.py"
PORT_BASE = 23476

BATCH = """#!/bin/bash
#SBATCH -n 2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH -o {out}/slurm-%j.out
export KMP_SLURM_PORT_BASE={port_base} TF_CPP_MIN_LOG_LEVEL=3
srun -n 2 {python} -m keras_mgpu_plugins.run {script} {out}/backup {out}/run {options}
code=$?
echo "run ${{SLURM_RESTART_COUNT:-0}} exit code $code"
if [ $code -eq 75 ]; then
  scontrol requeue "$SLURM_JOB_ID"   # stopped at a saved step: run again, resuming there
fi
exit $code
"""


def _env():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    for name in ("TF_CONFIG", "KMP_LAUNCH_WORKER", "KMP_NUM_WORKERS", "KMP_WORKER_INDEX",
                 "KMP_JOB_DIR", "KMP_RESTART"):
        env.pop(name, None)
    return env


def _submit(out: pathlib.Path, options: str) -> str:
    (out / "job.sh").write_text(BATCH.format(out=out, python=sys.executable, script=SCRIPT,
                                             port_base=PORT_BASE, options=options))
    done = subprocess.run(["sbatch", "--parsable", str(out / "job.sh")], cwd=out, env=_env(),
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip().split(";")[0]


def _state(job_id: str) -> tuple[str, int]:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                           timeout=30).stdout
    state = re.search(r"JobState=(\S+)", shown)
    restarts = re.search(r"Restarts=(\d+)", shown)
    return (state.group(1) if state else "GONE", int(restarts.group(1)) if restarts else 0)


def _wait_done(job_id: str, timeout: float = 600) -> tuple[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state, restarts = _state(job_id)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"):
            return state, restarts
        time.sleep(2)
    subprocess.run(["scancel", job_id], timeout=30)
    raise AssertionError(f"job {job_id} did not end within {timeout} s: {_state(job_id)}")


def test_a_signal_from_slurm_saves_the_step_the_job_requeues_itself_and_resumes(tmp_path):
    straight = tmp_path / "uninterrupted"
    straight.mkdir()
    job = _submit(straight, "")
    assert _wait_done(job)[0] == "COMPLETED", (straight / f"slurm-{job}.out").read_text()[-3000:]
    expected = np.load(straight / "run.npy")

    out = tmp_path / "preempted"
    out.mkdir()
    job = _submit(out, "--mark-at 1:1 --slow 0.3 --stop-check-interval 0")  # the next step
    deadline = time.monotonic() + 300
    while not (out / "run.mark").exists():
        assert time.monotonic() < deadline, _state(job)
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", job], check=True, timeout=30)
    state, restarts = _wait_done(job)
    log = (out / f"slurm-{job}.out").read_text()
    assert (state, restarts) == ("COMPLETED", 1), log[-4000:]
    assert "run 0 exit code 75" in log and "run 1 exit code 0" in log, log[-4000:]
    assert "stopped by SIGUSR1 (received by workers 0, 1) in epoch 2" in log, log[-4000:]
    np.testing.assert_array_equal(np.load(out / "run.npy"), expected)
