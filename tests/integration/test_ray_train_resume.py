"""Ray Train with kmp, 2 workers on a local Ray cluster (`examples/ray_train_resume.py`, as a
user runs it).

`TorchTrainer` (kmp's torch lane): Ray starts the workers and their torch process group,
`@kmp.parallelize` joins it; the two workers train one model equal to one device on the global
batches, and the chief alone writes the checkpoints. On `TorchTrainer` and `TensorflowTrainer`
alike, a worker killed (SIGKILL) under `FailureConfig(max_failures=1)` makes Ray start the group
again, which resumes mid-epoch from `BackupAndRestore`'s last backup on shared storage (the
epoch's batches before it drawn, not trained) and ends bit for bit where an uninterrupted run
ends; a node drained as a preempted one (Ray's preemption notice) stops the workers at one
agreed step with the backup written (exit code 75), and Ray starts the group again on another
node, which resumes at that step, bit-exact.
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
STEPS = 24  # the example's 3 epochs of 8 steps


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


@pytest.fixture(scope="module")
def tensorflow_plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf-plain")
    _run("--out", str(out), backend="tensorflow")
    return _records(out)


def _killed_and_resumed(backend: str, uninterrupted: dict, out: Path) -> None:
    """Worker 1 SIGKILLed at KILL_AT (step 7 of epoch 1's 8, backups every 2 batches): Ray
    starts the group again, which resumes at step 6, mid-epoch, and ends bit-exact."""
    summary = _run("--kill-at", str(KILL_AT), "--out", str(out), backend=backend)
    records = _records(out)
    assert summary["attempts"] == 2 and (1, 0) not in records  # worker 1 died at step 7
    for rank in (0, 1):
        resumed = records[rank, 1]
        assert resumed["resumed_at"] == KILL_AT - 1  # the last backup's step, mid-epoch: the
        assert resumed["steps"] == list(range(KILL_AT, STEPS + 1))  # batches before it not trained
        _weights_equal(resumed["weights"], uninterrupted[0, 0]["weights"])


def _preempted_and_resumed(backend: str, uninterrupted: dict, out: Path) -> None:
    """The workers' node drained as a preempted one: both stop at one agreed step with the
    backup written (75); Ray starts the group on another node, which resumes there bit-exact."""
    summary = _run("--preempt-at", str(PREEMPT_AT), "--out", str(out), backend=backend)
    records = _records(out)
    assert summary["attempts"] == 2
    first = [records[rank, 0] for rank in (0, 1)]
    assert [r["stopped"]["code"] for r in first] == [75, 75]
    assert all(r["stopped"]["saved"] for r in first)
    assert "Ray's preemption notice" in summary["output"]  # what each worker said on it
    assert "stopped by SIGTERM" in first[0]["stopped"]["message"]  # taken as a SIGTERM
    stopped_at = first[0]["stopped"]["step"]
    assert first[1]["stopped"]["step"] == stopped_at  # one agreed step on both, during training
    assert PREEMPT_AT <= stopped_at < STEPS, f"stopped at step {stopped_at} of {STEPS}"
    for rank in (0, 1):
        resumed = records[rank, 1]
        assert resumed["resumed_at"] == stopped_at  # the saved step, not an older backup
        assert resumed["steps"] == list(range(stopped_at + 1, STEPS + 1))
        _weights_equal(resumed["weights"], uninterrupted[0, 0]["weights"])


@torch_lane
def test_torch_trainer_a_killed_worker_restarts_the_group_which_resumes_mid_epoch_bit_exact(
        plain, tmp_path):
    _killed_and_resumed("torch", plain[1], tmp_path)


@torch_lane
def test_torch_trainer_a_preempted_node_stops_at_a_saved_step_and_resumes_bit_exact(
        plain, tmp_path):
    _preempted_and_resumed("torch", plain[1], tmp_path)


@tensorflow_lane
def test_tensorflow_trainer_a_killed_worker_restarts_the_group_which_resumes_mid_epoch_bit_exact(
        tensorflow_plain, tmp_path):
    _killed_and_resumed("tensorflow", tensorflow_plain, tmp_path)


@tensorflow_lane
def test_tensorflow_trainer_a_preempted_node_stops_at_a_saved_step_and_resumes_bit_exact(
        tensorflow_plain, tmp_path):
    _preempted_and_resumed("tensorflow", tensorflow_plain, tmp_path)
