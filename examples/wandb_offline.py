"""W&B offline: a 2-device fit logged by WandbLogger, with kmp checkpoints and device metrics.

Runs offline by default (nothing leaves the machine; `wandb sync <run dir>` uploads
later), on 2 logical devices split from the CPU when there are fewer than 2 GPUs.
The data are synthetic (nothing is downloaded). At the end it reads the runs back
from their files and prints what W&B recorded.

    python examples/wandb_offline.py                      # 6 epochs, one process, 2 devices
    python examples/wandb_offline.py --quick              # 2 epochs, for tests
    python examples/wandb_offline.py --workers 2          # 2 worker processes: one run
    python examples/wandb_offline.py --workers 2 --mode group        # one run per worker
    python examples/wandb_offline.py --workers 2 --callbacks wandb   # W&B's own callbacks
    WANDB_MODE=online python examples/wandb_offline.py --project my-project
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import keras_mgpu_plugins as kmp

FEATURES, CLASSES, ROWS, BATCH = 16, 4, 1024, 64


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="2 epochs (for tests)")
    parser.add_argument("--devices", type=int, default=2, help="logical devices to simulate (1 worker)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (kmp.launch)")
    parser.add_argument("--mode", choices=["chief", "group"], default="chief", help="WandbLogger mode")
    parser.add_argument("--callbacks", choices=["kmp", "wandb"], default="kmp",
                        help="kmp: WandbLogger + kmp.callbacks; wandb: WandbMetricsLogger + WandbModelCheckpoint")
    parser.add_argument("--project", default="kmp-wandb-example")
    parser.add_argument("--dir", default=None, help="W&B dir and checkpoints (default: a temp dir)")
    return parser.parse_args(argv)


def make_data(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(FEATURES, CLASSES)), axis=1).astype("int32")
    return x, y


def build_model():
    import keras

    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(CLASSES)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def kmp_callbacks(options: dict) -> list:
    from keras_mgpu_plugins.integrations.wandb import WandbLogger

    checkpoint = os.path.join(options["dir"], "best.keras")
    return [
        kmp.callbacks.ModelCheckpoint(checkpoint, monitor="val_accuracy", save_best_only=True),
        kmp.callbacks.DeviceMetricsLogger(batch_size=BATCH, summary=False),
        WandbLogger(project=options["project"], mode=options["mode"], log_freq=4,
                    config={"learning_rate": 1e-2}),
    ]


def wandb_callbacks(options: dict) -> list:
    """What W&B's documentation shows: init, then its two Keras callbacks, on every worker."""
    import wandb
    from wandb.integration.keras import WandbMetricsLogger, WandbModelCheckpoint

    wandb.init(project=options["project"], config={"learning_rate": 1e-2})
    checkpoint = os.path.join(options["dir"], "best.keras")
    return [
        WandbMetricsLogger(log_freq=4),
        WandbModelCheckpoint(checkpoint, monitor="val_accuracy", save_best_only=True),
    ]


def train(options: dict) -> dict:
    """One worker's fit (the whole job when there is one worker)."""
    import keras

    keras.utils.set_random_seed(0)  # the same training whichever callbacks log it
    x, y = make_data()
    model = kmp.parallelize(build_model)()
    make = kmp_callbacks if options["callbacks"] == "kmp" else wandb_callbacks
    history = model.fit(
        x[:896], y[:896], batch_size=BATCH, epochs=options["epochs"],
        validation_data=(x[896:], y[896:]), callbacks=make(options), verbose=0,
    )
    if options["callbacks"] == "wandb":
        import wandb

        wandb.finish()
    return {"val_accuracy": history.history["val_accuracy"][-1],
            "replicas": model.distribute_strategy.num_replicas_in_sync}


def summarize(wandb_dir: str) -> dict:
    """Reads every run under `wandb_dir` back from its files."""
    from keras_mgpu_plugins.integrations._wandb_records import find_runs, read_run

    runs = [read_run(path) for path in find_runs(wandb_dir)]
    return {
        "runs": len(runs),
        "names": sorted(run.name or run.id for run in runs),
        "groups": sorted({run.group for run in runs}),
        "artifacts": sum(len(run.artifacts) for run in runs),
        "val_accuracy": [round(r["val_accuracy"], 4) for r in _epoch_rows(runs[:1])],
        "epoch_rows": len(_epoch_rows(runs)),
        "job_config": sorted({k for run in runs for k in ("num_workers", "num_replicas") if k in run.config}),
        "run_dirs": [str(run.path.parent) for run in runs],
    }


def _epoch_rows(runs: list) -> list[dict]:
    """Epoch rows, W&B's callbacks' keys (`epoch/val_accuracy`) renamed to Keras's."""
    rows = [row for run in runs for row in run.history if "epoch" in row or "epoch/epoch" in row]
    return [{k.removeprefix("epoch/"): v for k, v in row.items()} for row in rows]


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    out = args.dir or tempfile.mkdtemp(prefix="kmp-wandb-")
    os.makedirs(out, exist_ok=True)
    os.environ["WANDB_DIR"] = out
    options = {"epochs": 2 if args.quick else args.epochs, "dir": out, "project": args.project,
               "mode": args.mode, "callbacks": args.callbacks}
    if args.workers > 1:
        results = kmp.launch(train, num_workers=args.workers, args=(options,), timeout=600)
    else:
        import tensorflow as tf

        if len(tf.config.list_physical_devices("GPU")) < 2:
            kmp.simulate_devices(args.devices)  # before TensorFlow's runtime starts
        results = [train(options)]
    summary = summarize(out)
    print(f"{args.workers} worker(s), {results[0]['replicas']} replicas, callbacks={args.callbacks}"
          + (f", mode={args.mode}" if args.callbacks == "kmp" else ""))
    print(f"val_accuracy {results[0]['val_accuracy']:.3f}")
    for key in ("runs", "names", "groups", "val_accuracy", "artifacts", "epoch_rows", "job_config"):
        print(f"{key:>17}: {summary[key]}")
    print("run folders (upload with `wandb sync <folder>`):", *summary["run_dirs"], sep="\n  ")
    return {"results": results, **summary, "dir": out}


if __name__ == "__main__":
    main()
