"""A stop signal during a JAX `fit`: saved at one agreed step, then resumed bit-exact.

`tests/scripts/preempt.py` (Adam, Dropout, `shuffle=True`, seeded) on 2 processes
(`kmp-launch`, kmp's shared shuffle of the global rows) and on 2 devices of one
process (Keras's own shuffle, drawn from NumPy's global random state): SIGTERM to one
process stops every process at one step with the backup written (exit code 75), and
the same command again ends with the weights of the uninterrupted run, bit for bit. The
processes check at every step here (`--stop-check-interval 0`): that step is the batch after
the signal (at the defaults: `tests/multi_worker/test_stop_at_defaults.py`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.jax import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(600)]
SCRIPT = helpers.ROOT / "tests" / "scripts" / "preempt.py"


def run(tmp_path, name, *options, processes=2, devices=1):
    """`kmp-launch -n PROCESSES scripts/preempt.py` (or the script alone for one process)."""
    out = str(tmp_path / name)
    env = {**helpers.environment(), **helpers.simulated_devices(devices)}
    script = [str(SCRIPT), str(tmp_path / "backup"), out, "--stop-check-interval", "0", *options]
    command = ([sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", str(processes),
                "--timeout", "250", *script] if processes > 1 else [sys.executable, *script])
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stderr, out


def result(out):
    with open(out + ".json") as f:
        return np.load(out + ".npy"), json.load(f)["epochs"]


@pytest.mark.parametrize("processes, devices", [(2, 1), (1, 2)],
                         ids=["2 processes", "2 devices"])
def test_sigterm_stops_at_one_step_and_the_rerun_is_bit_exact(tmp_path, processes, devices):
    code, err, out = run(tmp_path, "uninterrupted", processes=processes, devices=devices)
    assert code == 0, err[-3000:]
    expected, epochs = result(out)
    assert epochs == [0, 1, 2]

    stopped = tmp_path / "again"
    stopped.mkdir()
    code, err, _ = run(stopped, "stopped", "--signal-at", f"1:2:{processes - 1}",
                       processes=processes, devices=devices)
    assert code == 75, err[-3000:]
    assert "in epoch 2 (of the progress bar), after 3 of its batches; BackupAndRestore saved" in err
    with open(stopped / "backup" / "training_metadata.json") as f:
        record = json.load(f)
    assert (record["epoch"], record["batches_done"]) == (1, 3)
    # the shuffle is one device's, drawn from NumPy's state at the epoch's start: no order
    # of kmp's own to record, on one process or several
    assert record["training"]["data_order"] is None and record["training"]["numpy_rng"]

    code, err, out = run(stopped, "resumed", processes=processes, devices=devices)
    assert code == 0, err[-3000:]
    weights, epochs = result(out)
    assert epochs == [1, 2]
    np.testing.assert_array_equal(weights, expected)


# --- elastic: a backup of 2 processes resumed on one process -----------------------------


@pytest.fixture(scope="module")
def two_process_backup(tmp_path_factory):
    """`shuffle=True` (one device's order, drawn from NumPy's state, on any number of
    processes): the uninterrupted 2-process run's weights, and the backup 2 processes wrote
    mid-epoch. (JAX draws Dropout's masks over the global batch: elastic with it.)"""
    folder = tmp_path_factory.mktemp("elastic")
    code, err, out = run(folder, "uninterrupted")
    assert code == 0, err[-3000:]
    code, err, _ = run(folder, "stopped", "--signal-at", "1:2:1")
    assert code == 75, err[-3000:]
    return result(out)[0], folder / "backup"


@pytest.mark.parametrize("devices", [2, 1])
def test_a_backup_of_2_processes_resumes_on_one_process_within_float_noise(
        tmp_path, two_process_backup, devices):
    expected, backup = two_process_backup
    shutil.copytree(backup, tmp_path / "backup")
    code, err, out = run(tmp_path, "resumed", processes=1, devices=devices)
    assert code == 0, err[-3000:]
    weights, epochs = result(out)
    assert epochs == [1, 2]
    np.testing.assert_allclose(weights, expected, rtol=0, atol=1e-5)
