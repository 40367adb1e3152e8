"""A worker that raises is reported as raising, with its exception, and `kmp-launch` exits 1,
on every lane; the workers the launcher stopped are said to be stopped by it.

Before, on JAX: `worker 1 of 2 raised ValueError (exit code -15)` and exit status 143 (what a
SIGTERM preemption gives): the worker had reported its error, but JAX's runtime held the
process until the launcher's SIGTERM."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(300)]

SCRIPT = pathlib.Path(__file__).with_name("raising_script.py")
ROOT = SCRIPT.parents[2]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_worker_that_raises_is_named_and_the_launcher_exits_1(job_env, tmp_path, rank):
    env = {**os.environ, "BOOM_RANK": str(rank),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2",
                           str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)
    summary = [line for line in done.stderr.splitlines()
               if line.startswith(f"kmp-launch: worker {rank} of 2 ")]
    assert done.returncode == 1, done.stderr[-3000:]
    assert len(summary) == 1, done.stderr[-3000:]
    assert summary[0].startswith(f"kmp-launch: worker {rank} of 2 raised ValueError ("), summary
    assert "exit code -" not in summary[0] and "SIGTERM" not in summary[0]
    assert f"ValueError: worker {rank} broke on purpose" in done.stderr
