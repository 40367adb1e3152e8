"""A real SLURM on localhost: `srun -n 2 python train.py` with `@kmp.parallelize`.

Needs running SLURM daemons (slurmctld, slurmd, munged) whose `sinfo` answers, e.g. Debian's
`slurm-wlm` and `munge` packages started on one node by
`tests/integration/slurm_localhost.sh` (it prints the `SLURM_CONF` to export). Skipped,
with the reason, where none answer (CI does not start them). One `sbatch --wait` job runs:

1. `srun -n 2 python train.py crash`: topology from SLURM (2 workers, task 0 the chief,
   ports from `KMP_SLURM_PORT_BASE`), `BackupAndRestore` and a chief-only
   `ModelCheckpoint`; worker 1 dies after epoch 2, `--kill-on-bad-exit` ends the step;
2. at once, the same job and ports: `srun -n 2 python train.py` resumes at epoch 3 from the
   backup and finishes, with identical weights on both workers. Where that relaunch fails
   (seen before `strategy.py`'s port check bound with SO_REUSEADDR: a port whose old
   connections were in TIME_WAIT was refused), the job retries once after 65 s, so the
   resume is still checked, and the at-once test fails;
3. `srun -n 1` in the 2-task allocation (1 worker: the step's task count), and `python` in
   the batch script itself, not a task of any step (a `TopologyError` that says so);
4. `srun -n 2 python -m keras_mgpu_plugins.run module_level.py`: a program that adapts a
   `Normalization` layer and resizes images at module level, before its `@kmp.parallelize`
   factory (a keras.io ViT's shape); the runner creates the strategy first, both workers end
   bit-identical with `srun -n 1`'s weights (tests/multi_worker/test_cluster_env.py runs it
   with TF_CONFIG and SLURM variables set by hand);
5. step 0's variables copied into the batch script (its slurmstepd is `[JOB.batch]`), and a
   subprocess of a task's TensorFlow process that inherited the task's variables: each
   a `TopologyError` naming the mismatch.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.multi_worker.test_cluster_env import MODULE_LEVEL_WORK


def _slurm_missing() -> str | None:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "SLURM is not installed (sbatch, sinfo)"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"sinfo did not answer: {err}"
    states = done.stdout.split()
    if done.returncode != 0 or not any(s.rstrip("*") in ("idle", "mix") for s in states):
        return ("no SLURM daemons answer with an idle node (start them with "
                f"tests/integration/slurm_localhost.sh): {done.stderr.strip() or states}")
    return None


_MISSING = _slurm_missing()  # once: sinfo may retry for ~20 s where the daemons are down

pytestmark = [
    pytest.mark.slurm, pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(1000),
    pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING)),
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PORT_BASE = 23456

TRAIN = """
import json, os, sys
import numpy as np
import keras
import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import events

out, crash = sys.argv[1], sys.argv[2:] == ["crash"]
topology = kmp.topology()

@kmp.parallelize
def build():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model

model = build()
step = os.environ["SLURM_STEP_ID"]
with open(os.path.join(out, f"start-{step}-{topology.worker_index}.json"), "w") as f:
    json.dump({"num_workers": topology.num_workers, "worker_index": topology.worker_index,
               "is_chief": topology.is_chief, "source": topology.source,
               "cluster": {k: list(v) for k, v in (topology.cluster_spec or {}).items()},
               "replicas": model.distribute_strategy.num_replicas_in_sync,
               "job": os.environ["SLURM_JOB_ID"]}, f)
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
epochs, saved = [], []
events.subscribe(model, "checkpoint_saved", lambda p: saved.append(os.path.basename(p["path"])))

class Record(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        epochs.append(epoch)

class CrashWorker1(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if crash and epoch == 1 and topology.worker_index == 1:
            os._exit(3)

model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[
    kmp.callbacks.BackupAndRestore(os.path.join(out, "backup")),
    kmp.callbacks.ModelCheckpoint(os.path.join(out, "ckpt-{epoch}.weights.h5"),
                                  save_weights_only=True),
    Record(), CrashWorker1()])
record = {"step": step, "epochs": epochs, "saved": saved,
          "weights": [w.tolist() for w in model.get_weights()]}
with open(os.path.join(out, f"end-{step}-{topology.worker_index}.json"), "w") as f:
    json.dump(record, f)
"""

BATCH = """#!/bin/bash
#SBATCH -n 2
#SBATCH -o {out}/slurm-%j.out
export KMP_SLURM_PORT_BASE={port_base} TF_CPP_MIN_LOG_LEVEL=3
echo "at $(date +%s.%N) first step starts"
srun -n 2 --kill-on-bad-exit=1 {python} {out}/train.py {out} crash
code=$?
echo "at $(date +%s.%N) first step exit code $code"
srun -n 2 --kill-on-bad-exit=1 {python} {out}/train.py {out}
code=$?
echo "at $(date +%s.%N) second step exit code $code"
if [ $code -ne 0 ]; then
  sleep 65
  srun -n 2 --kill-on-bad-exit=1 {python} {out}/train.py {out}
  code=$?
  echo "at $(date +%s.%N) third step exit code $code"
fi
srun -n 2 --kill-on-bad-exit=1 {python} -m keras_mgpu_plugins.run {out}/module_level.py \\
  | sed 's/^RESULT /module-level two: /'
srun -n 1 {python} -m keras_mgpu_plugins.run {out}/module_level.py \\
  | sed 's/^RESULT /module-level one: /'
srun -n 1 {python} -c "import keras_mgpu_plugins as kmp; t = kmp.topology(); \\
print('one task step:', t.num_workers, t.worker_index, t.source)"
{python} -c "import keras_mgpu_plugins as kmp; kmp.topology()" 2>&1 | tail -1
SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_PROCID=1 SLURM_STEP_NUM_TASKS=2 \\
SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST {python} -c "import keras_mgpu_plugins as kmp; \\
kmp.topology()" 2>&1 | tail -1 | sed 's/^/stale step: /'
srun -n 2 {python} -c "import subprocess, sys, tensorflow, keras_mgpu_plugins as kmp; \\
kmp.topology(); subprocess.run([sys.executable, '-c', 'import keras_mgpu_plugins as kmp; \\
kmp.topology()'])" 2>&1 | grep errors.TopologyError | sed 's/^/subprocess: /'
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("slurm")
    (out / "train.py").write_text(textwrap.dedent(TRAIN))
    (out / "module_level.py").write_text(MODULE_LEVEL_WORK)
    (out / "job.sh").write_text(BATCH.format(out=out, python=sys.executable,
                                             port_base=PORT_BASE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    for name in ("TF_CONFIG", "KMP_LAUNCH_WORKER", "KMP_NUM_WORKERS", "KMP_WORKER_INDEX",
                 "KMP_JOB_DIR"):
        env.pop(name, None)
    done = subprocess.run(["sbatch", "--wait", "--parsable", str(out / "job.sh")], cwd=out,
                          env=env, capture_output=True, text=True, timeout=960)
    job_id = done.stdout.strip().split(";")[0]
    log = (out / f"slurm-{job_id}.out").read_text() if job_id else ""
    assert done.returncode == 0, done.stderr + log[-5000:]
    print("".join(line + "\n" for line in log.splitlines() if line.startswith("at ")))
    records = {path.stem: json.loads(path.read_text()) for path in out.glob("*-*-[01].json")}
    return out, log, records, job_id


def test_topology_from_slurm_two_workers_on_fixed_ports(job):
    _, log, records, job_id = job
    for rank, r in enumerate([records["start-0-0"], records["start-0-1"]]):
        assert (r["num_workers"], r["worker_index"], r["is_chief"], r["source"]) == (
            2, rank, rank == 0, "slurm")
        assert r["replicas"] == 2 and r["job"] == job_id
        host = r["cluster"]["worker"][0].split(":")[0]  # the node, from SLURM's node list
        assert r["cluster"] == {"worker": [f"{host}:{PORT_BASE}", f"{host}:{PORT_BASE + 1}"]}


def _resumed(records):
    steps = sorted({name.split("-")[1] for name in records if name.startswith("end-")})
    assert len(steps) == 1 and steps[0] in ("1", "2"), sorted(records)
    return records[f"end-{steps[0]}-0"], records[f"end-{steps[0]}-1"]


def test_worker_1_dies_then_the_same_job_resumes_from_the_backup(job):
    _, log, records, _ = job
    assert " first step exit code 3" in log or " first step exit code 1" in log, log[-3000:]
    assert "end-0-0" not in records and "end-0-1" not in records  # neither finished
    chief, other = _resumed(records)
    assert chief["epochs"] == other["epochs"] == [2, 3]  # epochs 1-2 came from the backup
    assert chief["weights"] == other["weights"]


def test_the_relaunch_at_once_on_the_same_ports_works(job):
    _, log, records, _ = job
    assert " second step exit code 0" in log, log[-3000:]
    assert _resumed(records)[0]["step"] == "1"


def test_checkpoints_written_once_by_the_chief(job):
    out, _, records, _ = job
    chief, other = _resumed(records)
    assert chief["saved"] == ["ckpt-3.weights.h5", "ckpt-4.weights.h5"]
    assert other["saved"] == []
    files = sorted(p.name for p in out.iterdir() if p.name.startswith("ckpt-"))
    assert files == [f"ckpt-{e}.weights.h5" for e in (1, 2, 3, 4)]  # 1-2 by the first step
    assert not [p for p in out.iterdir() if "tmp" in p.name]


def test_step_variables_decide_and_a_non_task_process_is_refused(job):
    _, log, _, _ = job
    assert "one task step: 1 0 local" in log, log[-3000:]
    assert "TopologyError" in log and "not a task of a SLURM job step" in log, log[-3000:]


def test_variables_of_another_step_or_task_are_refused(job):
    _, log, _, job_id = job
    stale = [line for line in log.splitlines() if line.startswith("stale step: ")]
    assert stale, log[-3000:]
    assert (f"runs in SLURM job step {job_id}.batch (under slurmstepd pid " in stale[0]
            and f"but its SLURM variables describe step {job_id}.0 (SLURM_JOB_ID={job_id}, "
            "SLURM_STEP_ID=0): they were inherited or copied from another step." in stale[0]
            and stale[0].startswith("stale step: keras_mgpu_plugins.errors.TopologyError: "
                                    "SLURM variables for a different task: ")), stale[0]
    subprocess_lines = [line for line in log.splitlines() if line.startswith("subprocess: ")]
    assert len(subprocess_lines) == 2, log[-3000:]  # one per task
    for line in subprocess_lines:
        assert "claims to be task SLURM_PROCID=" in line
        assert "started by a process of that task that runs TensorFlow" in line


def _module_level_results(log: str, label: str) -> list[dict]:
    prefix = f"module-level {label}: "
    return [json.loads(line[len(prefix):]) for line in log.splitlines()
            if line.startswith(prefix)]


def test_module_level_tensorflow_work_runs_under_srun_through_the_runner(job):
    _, log, _, _ = job
    two = sorted(_module_level_results(log, "two"), key=lambda r: r["worker"])
    [one] = _module_level_results(log, "one")
    assert [(r["worker"], r["source"], r["replicas"], r["multi_worker"]) for r in two] == [
        (0, "slurm", 2, True), (1, "slurm", 2, True)], log[-3000:]
    assert (one["source"], one["replicas"], one["multi_worker"]) == ("local", 1, False)
    assert two[0]["weights"] == two[1]["weights"]
    for got, want in zip(two[0]["weights"], one["weights"], strict=True):
        np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)
