"""Ray Train: `TensorflowTrainer` with a `@kmp.parallelize` model and kmp callbacks.

Starts a local Ray cluster, runs the same training function in each Ray worker
(Ray sets `TF_CONFIG`; `kmp.parallelize` reads it and creates the
`MultiWorkerMirroredStrategy` inside the worker), with
`kmp.callbacks.ModelCheckpoint` (written by the chief only),
`kmp.callbacks.EarlyStopping` (every worker stops at the chief's epoch, here on a
value that differs between workers) and `kmp.callbacks.StallWatchdog`. Each
worker writes what it saw to `<out>/worker-<rank>.json`; the last line printed
is a JSON summary.

    pip install "keras_mgpu_plugins[tensorflow,ray]"   # Ray's TensorflowTrainer runs TensorFlow
    python examples/ray_train.py --quick --out /tmp/ray-run
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile

GLOBAL_BATCH = 16
# A monitored value that differs per worker: alone, the chief would stop after its
# second epoch (its value rises; patience=0), worker 1 never (its value falls). Both
# follow the chief.
CHIEF_VALUES = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
OTHER_VALUES = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]


def train_loop_per_worker(config: dict) -> None:
    """What each Ray worker runs: the same code as under `kmp-launch` or SLURM."""
    import hashlib

    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks import events

    @kmp.parallelize
    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    topology = kmp.topology()
    model = build()
    rng = np.random.default_rng(0)  # the same arrays on every worker: Keras shards them
    x = rng.normal(size=(128, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    values = CHIEF_VALUES if topology.is_chief else OTHER_VALUES

    class PerWorkerValue(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            logs["per_worker"] = values[epoch]

    saved: list[str] = []  # the checkpoints this worker wrote (the chief's only)
    events.subscribe(model, "checkpoint_saved",
                     lambda payload: saved.append(os.path.basename(payload["path"])))
    out = config["out_dir"]
    history = model.fit(
        x, y, batch_size=GLOBAL_BATCH, epochs=config["epochs"], verbose=0,
        callbacks=[
            PerWorkerValue(),
            kmp.callbacks.EarlyStopping(monitor="per_worker", mode="min", patience=0),
            kmp.callbacks.ModelCheckpoint(os.path.join(out, "ckpt-{epoch}.weights.h5"),
                                          save_weights_only=True),
            # Heartbeats in a folder every worker reads (one node here; a shared mount across nodes).
            kmp.callbacks.StallWatchdog(timeout=300, directory=os.path.join(out, "watchdog")),
        ])
    weights = [w.tolist() for w in model.get_weights()]
    record = {
        "rank": topology.worker_index, "is_chief": topology.is_chief,
        "num_workers": topology.num_workers,
        "replicas": model.distribute_strategy.num_replicas_in_sync,
        "epochs_run": len(history.history["loss"]),
        "weights_sha256": hashlib.sha256(json.dumps(weights).encode()).hexdigest(),
        "checkpoints_saved": saved,
        "weights": weights,
        "tf_config": json.loads(os.environ.get("TF_CONFIG", "{}")),
    }
    with open(os.path.join(out, f"worker-{topology.worker_index}.json"), "w") as f:
        json.dump(record, f)


def run(out_dir: str, epochs: int, num_workers: int = 2) -> dict:
    """Trains on a local Ray cluster; returns the summary of what each worker wrote."""
    try:
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in ("ray", "tensorflow"):
            raise
        raise SystemExit(f"examples/ray_train.py needs Ray Train and TensorFlow ({err}): Ray's "
                         "TensorflowTrainer runs TensorFlow in each worker. Install both with: "
                         'pip install "keras_mgpu_plugins[tensorflow,ray]"') from err

    ray.init(num_cpus=num_workers, include_dashboard=False, log_to_driver=True)
    try:
        trainer = TensorflowTrainer(
            train_loop_per_worker,
            train_loop_config={"out_dir": out_dir, "epochs": epochs},
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=False),
            run_config=RunConfig(name="kmp-ray-example",
                                 storage_path=os.path.join(out_dir, "ray_results")),
        )
        trainer.fit()
    finally:
        ray.shutdown()
    workers = []
    for rank in range(num_workers):
        with open(os.path.join(out_dir, f"worker-{rank}.json")) as f:
            workers.append(json.load(f))
    checkpoints = sorted(name for name in os.listdir(out_dir) if name.startswith("ckpt-"))
    return {"ray": ray.__version__, "workers": workers, "checkpoints": checkpoints,
            "other_files": sorted(set(os.listdir(out_dir)) - set(checkpoints) - {
                "ray_results", "watchdog", *(f"worker-{r}.json" for r in range(num_workers))}),
            "heartbeats": {path.name: json.loads(path.read_text())["state"]
                           for path in sorted(pathlib.Path(out_dir, "watchdog").glob("heartbeat-*.json"))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few epochs (for tests)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--out", default=None, help="output folder (default: a new temporary one)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="kmp-ray-")
    os.makedirs(out, exist_ok=True)
    summary = run(out, epochs=4 if args.quick else args.epochs)
    for worker in summary["workers"]:
        worker.pop("weights")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
