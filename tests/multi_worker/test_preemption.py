"""A stop signal during a 2-worker TensorFlow `fit` (`kmp-launch`): saved, then resumed bit-exact.

`tests/scripts/preempt.py` trains with `kmp.callbacks.BackupAndRestore` (Adam, Dropout,
`shuffle=True`, seeded). A SIGTERM sent to one worker, or to `kmp-launch` (which forwards
it), stops every worker at one agreed step with the backup of that step written
(exit code 75); the same command again resumes mid-epoch and ends with the weights of
the uninterrupted run, bit for bit. The workers check at every step here
(`--stop-check-interval 0`), so that step is the batch after the signal; at the defaults
(a check every K steps) see `test_stop_at_defaults.py`.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(600)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tests" / "scripts" / "preempt.py"


def launch(tmp_path, name, *script_options, workers=2, signal_launcher_at_mark=False, env=None,
           options=()):
    """Runs `kmp-launch -n WORKERS [OPTIONS] preempt.py [SCRIPT_OPTIONS]`: (exit code, stderr,
    out prefix)."""
    out = str(tmp_path / name)
    pythonpath = filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), **(env or {})}
    command = [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", str(workers),
               "--timeout", "280", *options, str(SCRIPT), str(tmp_path / "backup"), out,
               "--stop-check-interval", "0", *script_options]
    proc = subprocess.Popen(command, cwd=tmp_path, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if signal_launcher_at_mark:
        while not os.path.exists(out + ".mark") and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err, out


def weights(out):
    return np.load(out + ".npy")


def events(out):
    with open(out + ".json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted")
    code, err, out = launch(folder, "run")
    assert code == 0, err[-3000:]
    assert events(out)["epochs"] == [0, 1, 2]
    return weights(out)


def test_sigterm_to_one_worker_stops_both_at_one_step_and_the_rerun_is_bit_exact(
        tmp_path, uninterrupted):
    code, err, _ = launch(tmp_path, "stopped", "--signal-at", "1:2:1")
    assert code == 75, err[-3000:]
    assert err.rstrip().endswith(
        "kmp-launch: The job was stopped by SIGTERM (received by worker 1) in epoch 2, after 3 "
        "of its batches, the step every worker agreed on; BackupAndRestore saved it in "
        f"{tmp_path / 'backup'}: run the same command again to resume (exit code 75).")
    with open(tmp_path / "backup" / "training_metadata.json") as f:
        record = json.load(f)
    assert (record["epoch"], record["batches_done"]) == (1, 3)
    assert record["training"]["world"] == {"replicas": 2, "workers": 2, "steps": 6}

    code, err, out = launch(tmp_path, "resumed")
    assert code == 0, err[-3000:]
    assert events(out)["epochs"] == [1, 2]
    np.testing.assert_array_equal(weights(out), uninterrupted)
    assert not (tmp_path / "backup").exists()


def test_sigterm_to_kmp_launch_is_forwarded_and_the_rerun_is_bit_exact(tmp_path, uninterrupted):
    code, err, _ = launch(tmp_path, "stopped", "--mark-at", "1:1", "--slow", "0.2",
                          signal_launcher_at_mark=True)
    assert code == 75, err[-3000:]
    assert ("kmp-launch: SIGTERM received: forwarded to every worker; in the fit with "
            "BackupAndRestore they stop at the next step they check together and save it "
            "there (120 s at most; SIGTERM again stops them at once).") in err
    assert ("kmp-launch: The job was stopped by SIGTERM (sent to kmp-launch, which forwarded "
            "it to every worker) in epoch 2, after ") in err
    code, err, out = launch(tmp_path, "resumed")
    assert code == 0, err[-3000:]
    np.testing.assert_array_equal(weights(out), uninterrupted)


def test_max_restarts_reruns_after_a_lost_worker_from_its_mid_epoch_backup(tmp_path,
                                                                           uninterrupted):
    """Worker 1 is SIGKILLed in the first run; the restart resumes from the periodic backup
    (every 2 batches) mid-epoch and ends with the uninterrupted run's weights."""
    code, err, out = launch(tmp_path, "run", "--kill-at", "1:2:1", "--save-freq", "2",
                            options=("--max-restarts", "2"))
    assert code == 0, err[-3000:]
    assert ("kmp-launch: restart 1 of 2: worker 1 of 2 was killed by signal SIGKILL (exit code "
            "-9); resuming from the last backup.") in err
    assert "restart 2" not in err
    assert events(out)["epochs"] == [1, 2]
    np.testing.assert_array_equal(weights(out), uninterrupted)


def test_max_restarts_reruns_after_a_worker_was_stopped_by_a_signal(tmp_path, uninterrupted):
    code, err, out = launch(tmp_path, "run", "--signal-at", "1:2:1",
                            options=("--max-restarts", "1"))
    assert code == 0, err[-3000:]
    assert ("kmp-launch: restart 1 of 1: the job was stopped by SIGTERM; resuming from the "
            f"backup in {tmp_path / 'backup'} (epoch 2, after 3 of its batches).") in err
    np.testing.assert_array_equal(weights(out), uninterrupted)


# --- elastic: a backup of 2 workers resumed on 1, 4 and 3 -----------------------------------

NO_DROPOUT = ("--dropout", "0")  # Dropout draws its masks per replica: not elastic


@pytest.fixture(scope="module")
def two_worker_backup(tmp_path_factory):
    """The uninterrupted 2-worker run's weights, and a backup 2 workers wrote mid-epoch."""
    folder = tmp_path_factory.mktemp("elastic")
    code, err, out = launch(folder, "uninterrupted", *NO_DROPOUT)
    assert code == 0, err[-3000:]
    code, err, _ = launch(folder, "stopped", *NO_DROPOUT, "--signal-at", "1:2:1")
    assert code == 75, err[-3000:]
    return weights(out), folder / "backup"


@pytest.mark.parametrize("workers", [1, 4])
def test_a_backup_of_2_workers_resumes_on_another_number_within_float_noise(
        tmp_path, two_worker_backup, workers):
    expected, backup = two_worker_backup
    shutil.copytree(backup, tmp_path / "backup")
    code, err, out = launch(tmp_path, "resumed", *NO_DROPOUT, workers=workers)
    assert code == 0, err[-3000:]
    assert events(out)["epochs"] == [1, 2]
    np.testing.assert_allclose(weights(out), expected, rtol=0, atol=1e-5)


def test_a_backup_resumed_where_the_global_batch_does_not_divide_is_refused(
        tmp_path, two_worker_backup):
    _, backup = two_worker_backup
    shutil.copytree(backup, tmp_path / "backup")
    code, err, _ = launch(tmp_path, "resumed", *NO_DROPOUT, workers=3)
    assert code != 0
    assert ("BackupMismatchError: The backup in backup_dir="
            f"'{tmp_path / 'backup'}' was written by 2 replicas (2 workers); here 3 replicas "
            "(3 workers) cannot split the global batch of 16 rows evenly") in err, err[-3000:]
    assert (tmp_path / "backup" / "latest.weights.h5").exists()  # kept, whole
