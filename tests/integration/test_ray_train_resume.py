"""Ray Train with kmp, 2 workers on a local Ray cluster (`examples/ray_train_resume.py`, as a
user runs it).

`TorchTrainer` (kmp's torch lane): Ray starts the workers and their torch process group,
`@kmp.parallelize` joins it; the two workers train one model equal to one device on the global
batches, and the chief alone writes the checkpoints. A worker killed under
`FailureConfig(max_failures=1)` makes Ray start the group again, which resumes from
`BackupAndRestore`'s backup on shared storage and ends bit for bit where an uninterrupted run
ends: mid-epoch on `TensorflowTrainer`, at the epoch's start on `TorchTrainer` (kmp's mid-epoch
resume on torch is not there yet: `BackupAndRestore` refuses it). A node drained as a preempted
one (Ray's preemption notice) stops the workers at one agreed step with the backup written
(exit code 75), and Ray starts the group again on another node, which resumes there bit-exact.
Needs `pip install -e ".[torch,test,ray]"` / `".[tensorflow,test,ray]"` (each test is skipped
without its trainer's packages); 2 to 4 minutes a run on 2 CPU cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.ray, pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                       reason='needs Ray: pip install -e ".[torch,test,ray]" or ".[tensorflow,test,ray]"'),
]
torch_lane = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason='needs torch: pip install -e ".[torch,test,ray]"')
tensorflow_lane = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                     reason='needs TensorFlow: pip install -e ".[tensorflow,test,ray]"')

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ray_train_resume.py"
KILL_AT = 7  # in epoch 1 of 8 steps; the backup before it: step 6
PREEMPT_AT = 5  # the notice reaches the workers a step or two later


def _run(*args: str, backend: str = "torch") -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TF_CONFIG", "KMP_", "WORLD_SIZE", "RANK", "MASTER_"))}
    env.update(KERAS_BACKEND=backend, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(EXAMPLE), "--backend", backend, *args],
                          cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "output": done.stdout + done.stderr}


def _records(out: Path) -> dict[tuple[int, int], dict]:
    return {(r["rank"], r["attempt"]): r for r in
            (json.loads(p.read_text()) for p in out.glob("worker-*.json"))}


def _weights_equal(got: list, expected: list) -> None:
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain")
    return _run("--out", str(out)), _records(out), out


@torch_lane
def test_torch_trainer_two_workers_train_one_model_equal_to_one_device(plain):
    summary, records, _ = plain
    assert summary["ray"].startswith("2.") and summary["attempts"] == 1
    chief, other = records[0, 0], records[1, 0]
    assert chief["backend"] == other["backend"] == "torch"
    assert chief["num_workers"] == other["num_workers"] == 2
    _weights_equal(chief["weights"], other["weights"])
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--one-device"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = json.loads(done.stdout.strip().splitlines()[-1])["weights"]
    for a, b in zip(chief["weights"], reference, strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)


@torch_lane
def test_torch_trainer_the_chief_alone_writes_each_checkpoint(plain):
    summary, records, out = plain
    assert records[0, 0]["checkpoints_saved"] == ["ckpt-1.weights.h5", "ckpt-2.weights.h5",
                                                  "ckpt-3.weights.h5"]
    assert records[1, 0]["checkpoints_saved"] == []
    assert summary["checkpoints"] == records[0, 0]["checkpoints_saved"]
    assert not [p for p in out.iterdir() if ".tmp" in p.name or p.name.startswith(".")]


@torch_lane
def test_torch_trainer_a_killed_worker_restarts_the_group_which_resumes_bit_exact(
        plain, tmp_path):
    """Killed at step 9, the first of epoch 2: resumed from the backup of epoch 1's end."""
    summary = _run("--kill-at", "9", "--backup-every", "epoch", "--out", str(tmp_path))
    records = _records(tmp_path)
    assert summary["attempts"] == 2 and (1, 0) not in records
    for rank in (0, 1):
        assert min(records[rank, 1]["steps"]) >= 8 and records[rank, 1]["steps"][-1] == 24
        _weights_equal(records[rank, 1]["weights"], plain[1][0, 0]["weights"])


@pytest.fixture(scope="module")
def tensorflow_plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf-plain")
    _run("--out", str(out), backend="tensorflow")
    return _records(out)


@tensorflow_lane
def test_tensorflow_trainer_a_killed_worker_restarts_the_group_which_resumes_mid_epoch_bit_exact(
        tensorflow_plain, tmp_path):
    summary = _run("--kill-at", str(KILL_AT), "--out", str(tmp_path), backend="tensorflow")
    records = _records(tmp_path)
    assert summary["attempts"] == 2 and (1, 0) not in records  # worker 1 died at step 7
    for rank in (0, 1):
        resumed = records[rank, 1]  # restored at step 6, the last backup: mid-epoch (the
        assert min(resumed["steps"]) == KILL_AT - 1  # epoch's batches before it drawn, not trained)
        assert KILL_AT in resumed["steps"] and resumed["steps"][-1] == 24
        _weights_equal(resumed["weights"], tensorflow_plain[0, 0]["weights"])


@tensorflow_lane
def test_tensorflow_trainer_a_preempted_node_stops_at_a_saved_step_and_resumes_bit_exact(
        tensorflow_plain, tmp_path):
    summary = _run("--preempt-at", str(PREEMPT_AT), "--out", str(tmp_path), backend="tensorflow")
    records = _records(tmp_path)
    assert summary["attempts"] == 2
    first = [records[rank, 0] for rank in (0, 1)]
    assert [r["stopped"]["code"] for r in first] == [75, 75]
    assert all(r["stopped"]["saved"] for r in first)
    assert "Ray's preemption notice" in summary["output"]  # what each worker said on it
    assert "stopped by SIGTERM" in first[0]["stopped"]["message"]  # taken as a SIGTERM
    stopped_at = first[0]["stopped"]["step"]
    assert first[1]["stopped"]["step"] == stopped_at >= PREEMPT_AT  # one agreed step on both
    for rank in (0, 1):
        resumed = records[rank, 1]
        assert min(resumed["steps"]) == stopped_at  # from the saved step, not an older backup
        _weights_equal(resumed["weights"], tensorflow_plain[0, 0]["weights"])
