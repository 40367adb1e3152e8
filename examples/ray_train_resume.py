"""Ray Train with kmp: `TorchTrainer` (kmp's torch lane) or `TensorflowTrainer`, and a lost
worker or a preempted node resumed from kmp's backup.

`--backend torch`: Ray's `TorchTrainer` starts the workers and their torch process group (gloo
on CPUs), which `@kmp.parallelize` joins (`KERAS_BACKEND=torch`). `--backend tensorflow`: Ray's
`TensorflowTrainer` sets `TF_CONFIG`, from which `@kmp.parallelize` makes the multi-worker
strategy. Either way `fit` trains one model over every worker, as one device would on the global
batch; `kmp.callbacks.ModelCheckpoint` writes on the chief only, `kmp.callbacks.BackupAndRestore`
backs up every 2 batches (`--backup-every`) on storage every worker reaches.
With `--kill-at STEP`, worker 1 kills itself (SIGKILL) at that step of the first attempt:
`FailureConfig(max_failures=1)` makes Ray start the worker group again, which resumes
mid-epoch from the backup. With `--preempt-at STEP`, the workers run on a node of their own
(a local multi-node cluster, `ray.cluster_utils.Cluster`) which is drained as a preempted spot
node is when training reaches that step (`ray drain-node --reason
DRAIN_NODE_REASON_PREEMPTION`, with a deadline): Ray's preemption notice reaches the workers,
`BackupAndRestore` stops them at one agreed step with the backup written (as a SIGTERM would;
exit code 75), and Ray starts the group again on another node, which resumes from the backup.
Either backend resumes mid-epoch, bit for bit (the batches before the backup's drawn, not
trained). Each worker writes what it saw to `<out>/worker-<rank>-<attempt>.json` (the step
it started at, `resumed_at`, and the steps it trained); the last line printed is a JSON summary.

    pip install torch --index-url https://download.pytorch.org/whl/cpu
    pip install -e ".[torch,ray]"            # or ".[tensorflow,ray]" for --backend tensorflow
    python examples/ray_train_resume.py --out /tmp/ray-torch
    python examples/ray_train_resume.py --kill-at 7 --out /tmp/ray-killed
    python examples/ray_train_resume.py --preempt-at 5 --out /tmp/ray-preempted
    python examples/ray_train_resume.py --backend tensorflow --kill-at 7 --out /tmp/ray-tf-killed
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading

GLOBAL_BATCH = 16
ROWS = 128  # 8 steps an epoch
EPOCHS = 3
BACKUP_EVERY = 2  # batches


def data():
    import numpy as np

    rng = np.random.default_rng(0)  # the same arrays on every worker: kmp feeds each its part
    x = rng.normal(size=(ROWS, 8)).astype("float32")
    return x, (x @ rng.normal(size=(8, 1))).astype("float32")


def build():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def train_loop_per_worker(config: dict) -> None:
    """What each Ray worker runs: the same code as under `kmp-launch`, torchrun or SLURM."""
    import signal
    import time

    import keras

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks import events
    from keras_mgpu_plugins.errors import TrainingStopped

    out, kill_at, preempt_at = config["out_dir"], config["kill_at"], config["preempt_at"]
    topology = kmp.topology()
    mine = f"attempt-{topology.worker_index}-"  # each worker counts the times it started
    attempt = len([n for n in os.listdir(out) if n.startswith(mine)])
    open(os.path.join(out, f"{mine}{attempt}"), "w").close()
    model = kmp.parallelize(build)()
    x, y = data()
    steps: list[int] = []

    class Steps(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # after BackupAndRestore's: the restored step
            record["resumed_at"] = int(self.model.optimizer.iterations.numpy())

        def on_train_batch_end(self, batch, logs=None):
            steps.append(int(self.model.optimizer.iterations.numpy()))
            if kill_at and attempt == 0 and topology.worker_index == 1 and steps[-1] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # a lost node: no chance to save
            if preempt_at and attempt == 0 and steps[-1] >= preempt_at:
                if steps[-1] == preempt_at:  # the node is drained from here: its notice
                    open(os.path.join(out, f"reached-{topology.worker_index}"), "w").close()
                    _wait_for(os.path.join(out, "drained"))  # comes within the next steps
                time.sleep(1.0)  # steps as long as a real model's, for the notice to come

    saved: list[str] = []
    events.subscribe(model, "checkpoint_saved",
                     lambda payload: saved.append(os.path.basename(payload["path"])))
    record = {"rank": topology.worker_index, "num_workers": topology.num_workers,
              "attempt": attempt, "backend": keras.backend.backend(), "steps": steps,
              "checkpoints_saved": saved}
    try:
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=config["epochs"], shuffle=False, verbose=0,
                  callbacks=[kmp.callbacks.BackupAndRestore(os.path.join(out, "backup"),
                                                            save_freq=config["backup_every"]),
                             kmp.callbacks.ModelCheckpoint(
                                 os.path.join(out, "ckpt-{epoch}.weights.h5"),
                                 save_weights_only=True),
                             Steps()])
    except TrainingStopped as stop:  # a preemption notice: the backup holds the agreed step
        record.update(stopped={"code": stop.code, "saved": stop.saved, "message": stop.message,
                               "step": stop.epoch * (ROWS // GLOBAL_BATCH) + stop.batches_done})
        _write(out, record)
        raise  # Ray sees the group stop, and starts it again
    _write(out, {**record, "weights": [w.tolist() for w in model.get_weights()]})


def _wait_for(path: str, timeout_s: float = 300.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)


def _write(out: str, record: dict) -> None:
    with open(os.path.join(out, f"worker-{record['rank']}-{record['attempt']}.json"), "w") as f:
        json.dump(record, f)


def one_device(epochs: int = EPOCHS) -> list:
    """The same model and batches on one device (the reference the 2 workers must equal)."""
    model = build()
    x, y = data()
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    return [w.tolist() for w in model.get_weights()]


def run(out_dir: str, backend: str = "torch", num_workers: int = 2, kill_at: int | None = None,
        preempt_at: int | None = None, backup_every: int | str = BACKUP_EVERY,
        epochs: int = EPOCHS) -> dict:
    """Trains on a local Ray cluster; returns what each worker wrote, per attempt."""
    try:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig

        if backend == "torch":
            from ray.train.torch import TorchTrainer as Trainer
        else:
            from ray.train.tensorflow import TensorflowTrainer as Trainer
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in ("ray", "torch", "tensorflow"):
            raise
        install = ('pip install torch --index-url https://download.pytorch.org/whl/cpu && '
                   'pip install -e ".[torch,ray]"' if backend == "torch" else
                   'pip install -e ".[tensorflow,ray]"')
        raise SystemExit(f"examples/ray_train_resume.py --backend {backend} needs Ray Train and "
                         f"{backend} ({err}): Ray's {Trainer_name(backend)} runs {backend} in "
                         f"each worker. Install both with: {install}") from err

    env = {"KERAS_BACKEND": backend, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
           "KMP_RAY_PREEMPTION_CHECK_EVERY": "1",  # ask Ray at every check: a few steps here
           "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}  # Ray's watcher of drained nodes
    cluster = None
    if preempt_at:  # the workers' node, drained when they reach `preempt_at`
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        node = cluster.add_node(num_cpus=num_workers)
        ray.init(address=cluster.address, runtime_env={"env_vars": env})
    else:
        ray.init(num_cpus=num_workers, include_dashboard=False, runtime_env={"env_vars": env})
    trainer = Trainer(
        train_loop_per_worker,
        train_loop_config={"out_dir": out_dir, "kill_at": kill_at, "preempt_at": preempt_at,
                           "backup_every": backup_every, "epochs": epochs},
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=False),
        run_config=RunConfig(name=f"kmp-ray-{backend}", storage_path=os.path.join(out_dir, "ray"),
                             failure_config=FailureConfig(max_failures=1)),
    )
    try:
        if cluster is None:
            trainer.fit()
        else:  # Ray starts nodes from the main thread only: the run goes on in another
            failed: list[BaseException] = []
            fit = threading.Thread(target=lambda: _catch(trainer.fit, failed), daemon=True)
            fit.start()
            _preempt(cluster, node, out_dir, num_workers, fit)
            fit.join()
            if failed:
                raise failed[0]
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    records = sorted(n for n in os.listdir(out_dir) if n.startswith("worker-"))
    workers = []
    for name in records:
        with open(os.path.join(out_dir, name)) as f:
            workers.append(json.load(f))
    return {"ray": ray.__version__, "workers": workers,
            "attempts": len([n for n in os.listdir(out_dir) if n.startswith("attempt-0-")]),
            "checkpoints": sorted(n for n in os.listdir(out_dir) if n.startswith("ckpt-"))}


def Trainer_name(backend: str) -> str:  # noqa: N802 - names the class
    return "TorchTrainer" if backend == "torch" else "TensorflowTrainer"


def _catch(call, failed: list) -> None:
    try:
        call()
    except BaseException as err:  # noqa: BLE001 - re-raised by the main thread
        failed.append(err)


def _preempt(cluster, node, out_dir: str, num_workers: int, fit: threading.Thread) -> None:
    """Once every worker reached the step (where they wait for `drained`): the workers' node
    drained as a preempted one (what Ray's autoscaler does on a spot node's notice), then a
    node for the restart."""
    import subprocess
    import sys
    import time

    while not all(os.path.exists(os.path.join(out_dir, f"reached-{r}"))
                  for r in range(num_workers)):
        if not fit.is_alive():
            return
        time.sleep(0.1)
    try:
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "drain-node",
                        "--address", cluster.address, "--node-id", node.node_id,
                        "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot",
                        "--deadline-remaining-seconds", "120"], check=True)
    finally:
        open(os.path.join(out_dir, "drained"), "w").close()  # the workers go on
    cluster.add_node(num_cpus=num_workers)  # where Ray starts the group again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["torch", "tensorflow"], default="torch",
                        help="Ray's TorchTrainer (kmp's torch lane) or TensorflowTrainer")
    parser.add_argument("--backup-every", default=str(BACKUP_EVERY),
                        help="BackupAndRestore's save_freq: batches, or 'epoch'")
    parser.add_argument("--kill-at", type=int, default=None,
                        help="worker 1 kills itself at this step of the first attempt")
    parser.add_argument("--preempt-at", type=int, default=None,
                        help="drain the workers' node as a preempted one at this step")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--quick", action="store_true", help=f"{EPOCHS} epochs (the default)")
    parser.add_argument("--one-device", action="store_true",
                        help="train the same model on one device instead (the reference)")
    parser.add_argument("--out", default=None, help="output folder (default: a new temporary one)")
    args = parser.parse_args()
    if args.one_device:
        print(json.dumps({"weights": one_device(EPOCHS if args.quick else args.epochs)}))
        return
    out = args.out or tempfile.mkdtemp(prefix="kmp-ray-")
    os.makedirs(out, exist_ok=True)
    every = args.backup_every if args.backup_every == "epoch" else int(args.backup_every)
    summary = run(out, args.backend, kill_at=args.kill_at, preempt_at=args.preempt_at,
                  backup_every=every, epochs=EPOCHS if args.quick else args.epochs)
    print(json.dumps({**summary, "workers": [
        {k: v for k, v in w.items() if k != "weights"} for w in summary["workers"]]}))


if __name__ == "__main__":
    main()
