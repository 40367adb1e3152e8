"""A `fit` stopped mid-epoch, then run again, on every lane: the active Keras backend's.

The same tests run on TensorFlow (CI's newest job), JAX (`JAX_SUBSET`) and torch
(`TORCH_SUBSET`), each lane's environment running them with its `KERAS_BACKEND`.
`tests/scripts/preempt.py` trains with `kmp.callbacks.BackupAndRestore` (Adam, an
unseeded Dropout: on torch it draws from torch's global generator; `shuffle=True`,
seeded), records every batch hook its callbacks saw, and logs with Keras's `CSVLogger`
(one file for a run and its rerun; listed first: its `on_train_begin` runs before the backup is read). Stopped (SIGTERM to
one worker, or one worker SIGKILLed after a periodic backup), then run again:

- the weights end bit-exact as the uninterrupted run's;
- the resumed epoch's callbacks see only the batches trained, from the first one on, with
  their real indices and full logs, as the uninterrupted run's callbacks saw them;
- the CSV file holds every epoch once, those logged before the stop kept.
"""

from __future__ import annotations

import csv
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
BACKEND = keras.backend.backend()
#: Every case: an unseeded Dropout, the batch hooks recorded, Keras's CSVLogger.
COMMON = ("--dropout-seed", "none", "--hooks")
#: One process: steps_per_execution=2 where Keras allows it (not on torch).
ONE_PROCESS = COMMON + ("--spe", "1" if BACKEND == "torch" else "2")
_STRIPPED = ("KERAS_DISTRIBUTION_", "TF_CONFIG", "SLURM_", "KMP_", "WORLD_SIZE", "RANK",
             "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS")


def run(folder: pathlib.Path, name: str, *options: str, processes: int = 2,
        log: str = "log") -> dict:
    """`kmp-launch -n PROCESSES preempt.py` (the script alone for one process) in `folder`:
    its exit code and stderr, and what the chief wrote (`weights`, `json`, and `csv`: the
    rows of Keras's `CSVLogger`, whose file `log.csv` a run and its rerun share)."""
    out, log_file = str(folder / name), str(folder / f"{log}.csv")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_STRIPPED) or k == "KMP_ALLOW_UNCHECKED_VERSIONS"}
    env.update(KERAS_BACKEND=BACKEND, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    script = [str(SCRIPT), str(folder / "backup"), out, "--csv", log_file, *options]
    command = ([sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", str(processes),
                "--timeout", "250", *script] if processes > 1 else [sys.executable, *script])
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    found = {"code": done.returncode, "err": done.stderr}
    if os.path.exists(out + ".json"):
        with open(out + ".json") as f:
            found["json"] = json.load(f)
        found["weights"] = np.load(out + ".npy")
    if os.path.exists(log_file):
        with open(log_file, newline="") as f:
            found["csv"] = list(csv.reader(f))
    return found


def ok(result: dict, code: int = 0) -> dict:
    assert result["code"] == code, result["err"][-3000:]
    return result


def hooks_from(result: dict, epoch: int, batch: int) -> list:
    """The batch hooks from (`epoch`, `batch`) on."""
    return [h for h in result["json"]["hooks"] if (h[0], h[2]) >= (epoch, batch)]


def assert_resumed_as_uninterrupted(resumed: dict, whole: dict, epoch: int, batch: int) -> None:
    np.testing.assert_array_equal(resumed["weights"], whole["weights"])  # bit-exact
    assert resumed["json"]["epochs"] == list(range(epoch, 3))
    # the resumed epoch's first hook is the first trained batch, with its real index; the
    # callbacks see the very hooks (indices, logs keys) the uninterrupted run's saw
    first = resumed["json"]["hooks"][0]
    assert first[:3] == [epoch, "begin", batch], first
    assert resumed["json"]["hooks"] == hooks_from(whole, epoch, batch)
    assert all(h[3] == ["loss"] for h in resumed["json"]["hooks"] if h[1] == "end")
    # Keras's CSVLogger: every epoch once; those before the stop as the stopped run wrote them
    header, *rows = resumed["csv"]
    assert header == whole["csv"][0] and [row[0] for row in rows] == ["0", "1", "2"]
    assert rows[:epoch] == whole["csv"][1:1 + epoch]
    assert rows[-1] == whole["csv"][-1]  # the last epoch, trained whole after the resume


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("uninterrupted")
    return {n: ok(run(folder, f"whole{n}", *(COMMON if n == 2 else ONE_PROCESS), processes=n,
                      log=f"whole{n}"))
            for n in (2, 1)}


def test_sigterm_mid_epoch_then_the_same_command_resumes_bit_exact(tmp_path, uninterrupted):
    """Worker 1 gets SIGTERM at the end of epoch 2's 3rd batch; the workers check at every
    batch's start (`stop_check_interval=0`): they stop before the 4th."""
    stopped = ok(run(tmp_path, "stopped", *COMMON, "--signal-at", "1:2:1",
                     "--stop-check-interval", "0"), 75)
    assert "after 3 of its batches" in stopped["err"]
    with open(tmp_path / "backup" / "training_metadata.json") as f:
        record = json.load(f)
    assert (record["epoch"], record["batches_done"]) == (1, 3)
    assert ("backend_rng_now" in record["training"]) == (BACKEND == "torch")
    resumed = ok(run(tmp_path, "resumed", *COMMON))
    assert_resumed_as_uninterrupted(resumed, uninterrupted[2], 1, 3)
    assert not (tmp_path / "backup").exists()


def test_a_worker_sigkilled_after_a_periodic_backup_then_rerun_resumes_bit_exact(
        tmp_path, uninterrupted):
    """Worker 1 dies at the end of epoch 2's 4th batch; on disk, the backup after its 3rd
    (`save_freq=3`)."""
    killed = run(tmp_path, "killed", *COMMON, "--kill-at", "1:3:1", "--save-freq", "3")
    assert killed["code"] != 0 and "killed by signal SIGKILL" in killed["err"], killed["err"]
    with open(tmp_path / "backup" / "training_metadata.json") as f:
        assert json.load(f)["batches_done"] == 3  # 6 batches per epoch: the 9th of the run
    resumed = ok(run(tmp_path, "resumed", *COMMON, "--save-freq", "3"))
    assert_resumed_as_uninterrupted(resumed, uninterrupted[2], 1, 3)


def test_one_process_resumes_bit_exact_its_own_shuffle_and_steps_per_execution(
        tmp_path, uninterrupted):
    """Keras's own shuffle (TensorFlow's, NumPy's on JAX, torch's `RandomSampler`), and on
    TensorFlow and JAX 2 batches per step: the signal at the end of batch index 1 (the
    epoch's first step there), the stop at the next batch's start (one process reads the
    signal at every batch's start)."""
    ok(run(tmp_path, "stopped", *ONE_PROCESS, "--signal-at", "1:1:0", processes=1), 75)
    with open(tmp_path / "backup" / "training_metadata.json") as f:
        done = json.load(f)["batches_done"]
    assert done == 2
    resumed = ok(run(tmp_path, "resumed", *ONE_PROCESS, processes=1))
    assert_resumed_as_uninterrupted(resumed, uninterrupted[1], 1, done)
