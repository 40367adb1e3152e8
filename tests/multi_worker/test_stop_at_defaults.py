"""A stop signal in a 2-process job at `BackupAndRestore`'s defaults, on this lane's backend.

Run with each lane's backend (TensorFlow, JAX, torch: `.ci/run` lists this file in every
subset): `kmp-launch -n 2 tests/scripts/preempt.py` (Adam, Dropout, `shuffle=True`, seeded;
60 batches an epoch, each batch end 20 ms of sleep), worker 1 sends itself SIGTERM after
batch 10. The workers check for a signal every K steps only (K agreed from the measured
step and check times, at most `stop_check_interval`, 2 s, apart): every worker stops at the
same step, the backup holds it, no worker trained beyond it, the stop came within the
interval, and the same command again ends with the uninterrupted run's weights, bit for bit.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "preempt.py"
STEPS, SLOW = 60, 0.02  # 960 rows, batches of 16
_STRIPPED = ("KERAS_DISTRIBUTION_", "TF_CONFIG", "SLURM_", "KMP_", "WORLD_SIZE", "RANK",
             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "XLA_FLAGS",
             "JAX_NUM_CPU_DEVICES", "TORCHELASTIC_")


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_STRIPPED) or k == "KMP_ALLOW_UNCHECKED_VERSIONS"}
    env.update(KERAS_BACKEND=keras.backend.backend(), CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if keras.backend.backend() == "jax":
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _launch(folder: pathlib.Path, name: str, *options: str) -> tuple[int, str, str]:
    out = str(folder / name)
    done = subprocess.run(
        [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2", "--timeout", "250",
         "--all-output", str(SCRIPT), str(folder / "backup"), out, "--rows", str(16 * STEPS), "--epochs", "2",
         "--slow", str(SLOW), "--progress", *options],
        cwd=folder, env=_environment(), capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr, out


def test_a_stop_at_the_defaults_is_one_step_on_every_worker_saved_and_resumed_exactly(
        tmp_path):
    code, err, out = _launch(tmp_path, "uninterrupted")
    assert code == 0, err[-3000:]
    expected = np.load(out + ".npy")

    folder = tmp_path / "stopped"
    folder.mkdir()
    code, err, out = _launch(folder, "stopped", "--signal-at", "0:10:1")
    assert code == 75, err[-3000:]
    with open(folder / "backup" / "training_metadata.json") as f:
        record = json.load(f)
    saved_step = record["epoch"] * STEPS + record["batches_done"]
    trained = {}
    for worker in (0, 1):  # the last batch each worker trained ("epoch batch")
        epoch, batch = map(int, pathlib.Path(f"{out}.progress-{worker}").read_text().split())
        trained[worker] = epoch * STEPS + batch + 1
    assert trained == {0: saved_step, 1: saved_step}, (trained, record)
    assert 11 <= saved_step < 2 * STEPS  # mid-run: after the signal, before the end
    signalled = float(pathlib.Path(out + ".signalled").read_text())
    took = (folder / "backup" / "latest.weights.h5").stat().st_mtime - signalled
    assert took < 2.0 + 1.0, f"{took:.2f} s from the signal to the backup"  # interval + a step
    assert ("[worker 1] kmp: worker 1 of 2 received SIGTERM: training stops at the workers' "
            "next check, in ") in err

    code, err, out = _launch(folder, "resumed")
    assert code == 0, err[-3000:]
    np.testing.assert_array_equal(np.load(out + ".npy"), expected)
