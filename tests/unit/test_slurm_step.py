"""SLURM variables for a different step or task than the process that reads them.

The decision is a pure function of the environment and the process ancestry; one
test runs it on real processes (a parent that calls itself `slurmstepd: [5.0]`).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from keras_mgpu_plugins.cluster.slurm import STEP_CHECK_ENV, check_step, step_mismatch

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
ME = (300, "python train.py", True)


def test_the_task_itself_passes():
    assert step_mismatch(ENV, [ME, (200, "slurmstepd: [12.0]", False)]) is None


def test_a_shell_or_python_wrapper_without_tensorflow_passes():
    ancestry = [ME, (250, "/bin/bash run.sh", False),
                (240, "/opt/conda/bin/python /opt/conda/bin/conda run python train.py", False),
                (200, "slurmstepd: [12.0]", False)]
    assert step_mismatch(ENV, ancestry) is None


def test_no_slurmstepd_no_check():
    """A container, another launcher: nothing to compare with."""
    assert step_mismatch(ENV, [ME, (1, "/sbin/init", False)]) is None
    assert step_mismatch(ENV, [(1, "slurmstepd: [12.3]", True)]) is None  # only the process


def test_variables_of_another_step_are_refused():
    message = step_mismatch(ENV, [ME, (250, "/bin/bash job.sh", False),
                                  (200, "slurmstepd: [12.batch]", False)])
    assert message.startswith("this process (pid 300) runs in SLURM job step 12.batch (under "
                              "slurmstepd pid 200), but its SLURM variables describe step "
                              "12.0 (SLURM_JOB_ID=12, SLURM_STEP_ID=0)")
    stale = {**ENV, "SLURM_JOB_ID": "11"}
    assert "describe step 11.0" in step_mismatch(stale, [ME, (200, "slurmstepd: [12.0]", False)])


def test_a_subprocess_of_the_training_script_is_refused():
    message = step_mismatch(ENV, [(400, "python loader.py", True), ME,
                                  (200, "slurmstepd: [12.0]", False)])
    assert message.startswith("this process (pid 400) claims to be task SLURM_PROCID=1 of step "
                              "12.0, but it was started by a process of that task that runs "
                              "TensorFlow (pid 300: 'python train.py')")
    assert f"{STEP_CHECK_ENV}=0" in message


def test_without_step_variables_nothing_is_decided_here():
    """The batch script itself: `slurm_fields` raises its own error first."""
    env = {k: v for k, v in ENV.items() if k != "SLURM_STEP_ID"}
    assert step_mismatch(env, [ME, (200, "slurmstepd: [12.batch]", False)]) is None




@pytest.mark.parametrize("step, check, want", [
    ("0", None, "slurm"), ("1", None, "TopologyError SLURM variables for a different task: "
                           "this process (pid "), ("1", "0", "slurm")])
def test_real_processes_under_a_parent_named_slurmstepd(step, check, want):
    child = ("import os\nfrom keras_mgpu_plugins.topology import TopologyError, "
             "topology_from_env\n"
             "try:\n    print(topology_from_env(os.environ).source)\n"
             "except TopologyError as err:\n    print(type(err).__name__, err)\n")
    # Renamed by `exec -a`, the parent cannot find its sys.executable: it gets the path.
    parent = f"import os, subprocess; subprocess.run([os.environ['PY'], '-c', {child!r}])"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SLURM_JOB_ID": "5",
           "SLURM_STEP_ID": step, "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
           "SLURM_STEP_NODELIST": "localhost"}
    env.pop("TF_CONFIG", None)
    if check is not None:
        env[STEP_CHECK_ENV] = check
    done = subprocess.run(["bash", "-c", f'exec -a "slurmstepd: [5.0]" {sys.executable} -c '
                           '"$PARENT"'], env={**env, "PARENT": parent, "PY": sys.executable},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith(want), done.stdout + done.stderr
    if step == "1" and check is None:
        assert "runs in SLURM job step 5.0" in done.stdout


def test_check_step_passes_in_this_process_without_slurmstepd():
    check_step(ENV)  # pytest has no slurmstepd ancestor here: no check, no error
