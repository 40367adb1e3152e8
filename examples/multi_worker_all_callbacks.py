"""Two workers, every callback: a multi-worker job whose outcome you can check.

    kmp-launch -n 2 examples/multi_worker_all_callbacks.py --quick
    kmp-launch -n 2 examples/multi_worker_all_callbacks.py --out runs/job --epochs 20

Fault tolerance: make worker 1 fail at the end of an epoch (kmp-launch then
stops every worker), and run again without the flag: training resumes from
the backup, on both workers, at the same epoch::

    kmp-launch -n 2 examples/multi_worker_all_callbacks.py --out runs/job --fail-at-epoch 2
    kmp-launch -n 2 examples/multi_worker_all_callbacks.py --out runs/job

Every worker runs this same file; the callbacks make the job correct:

- `ModelCheckpoint`: the chief alone writes `best.keras`, atomically;
- `EarlyStopping`: every worker stops at the same epoch (the chief's value decides);
- `BackupAndRestore`: `backup/` is written by the chief, read by all on restart,
  and deleted when training completes;
- `DeviceMetricsLogger`: `device_metrics.csv` (chief) holds every worker's devices;
- `WeightSyncVerifier`: replicas and workers hold identical weights, checked
  at train begin and after every epoch.

What it writes in `--out` (a folder every worker sees; by default one in the
temp folder named after the job): those files, plus `worker-<i>.json` from
each worker: the epochs it ran, a SHA-256 of its weights after each epoch and
at the end, and the verifier's checks. The chief prints, last, one line of
JSON comparing the workers (through `kmp.collective.all_gather`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile

import numpy as np

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins import collective

GLOBAL_BATCH = 64


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="3 epochs (for tests)")
    parser.add_argument("--out", default=None, help="output folder shared by the workers")
    parser.add_argument("--fail-at-epoch", type=int, default=None, metavar="N",
                        help="worker 1 raises at the end of epoch N (1-based)")
    return parser.parse_args(argv)


def default_out(topo) -> str:
    """A folder every worker of this job names the same way (and another job does not)."""
    if os.environ.get("KMP_JOB_ID"):  # set by kmp-launch, the same in every worker
        job = os.environ["KMP_JOB_ID"]
    elif topo.cluster_spec:
        first = topo.cluster_spec.get("chief", topo.cluster_spec.get("worker"))[0]
        job = first.rpartition(":")[2]
    else:
        job = str(os.getpid())
    return os.path.join(tempfile.gettempdir(), f"kmp-all-callbacks-{job}")


def load_data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")  # (1797, 64)
    y = digits.target.astype("int64")
    return (x[:1280], y[:1280]), (x[1280:1536], y[1280:1536])


@kmp.parallelize  # several workers -> MultiWorkerMirroredStrategy (kmp-launch created it)
def build_model():
    import keras

    keras.utils.set_random_seed(0)  # same initial weights everywhere (the verifier checks)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def weights_sha256(weights) -> str:
    digest = hashlib.sha256()
    for array in weights:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def make_recorder(record: dict, fail_at_epoch: int | None, worker: int):
    """Records epochs and weights digests; with `fail_at_epoch`, worker 1 fails there."""
    import keras

    def on_epoch_begin(epoch, logs=None):
        record["epochs"].append(epoch)

    def on_epoch_end(epoch, logs=None):
        record["epoch_sha256"][str(epoch)] = weights_sha256(recorder.model.get_weights())
        record["val_loss"][str(epoch)] = float(logs["val_loss"])
        if fail_at_epoch is not None and worker == 1 and epoch + 1 == fail_at_epoch:
            raise RuntimeError(f"worker 1: simulated failure at the end of epoch {epoch + 1}")

    recorder = keras.callbacks.LambdaCallback(on_epoch_begin=on_epoch_begin, on_epoch_end=on_epoch_end)
    return recorder


def main(argv=None) -> dict:
    args = parse_args(argv)
    topo = kmp.topology()
    out = args.out or default_out(topo)
    os.makedirs(out, exist_ok=True)
    epochs = 3 if args.quick else args.epochs
    (x, y), (x_val, y_val) = load_data()

    model = build_model()
    record = {"worker": topo.worker_index, "is_chief": topo.is_chief, "epochs": [],
              "epoch_sha256": {}, "val_loss": {}}
    verifier = kmp.callbacks.WeightSyncVerifier(on_mismatch="raise")
    callbacks = [
        make_recorder(record, args.fail_at_epoch, topo.worker_index),  # first: sees the epoch's weights
        kmp.callbacks.BackupAndRestore(backup_dir=os.path.join(out, "backup")),
        verifier,
        kmp.callbacks.ModelCheckpoint(os.path.join(out, "best.keras"), monitor="val_loss",
                                      save_best_only=True),
        kmp.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True),
        kmp.callbacks.DeviceMetricsLogger(batch_size=GLOBAL_BATCH, summary=topo.is_chief,
                                          csv_path=os.path.join(out, "device_metrics.csv")),
    ]
    if topo.is_chief:
        print(f"{topo.num_workers} worker(s), {model.distribute_strategy.num_replicas_in_sync} "
              f"replicas, global batch {GLOBAL_BATCH}; writing to {out}")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, validation_data=(x_val, y_val),
              shuffle=False, callbacks=callbacks, verbose=2 if topo.is_chief else 0)

    record["final_sha256"] = weights_sha256(model.get_weights())
    record["verifier_checks"] = len(verifier.reports)
    record["verifier_mismatches"] = sum(len(r.mismatches) for r in verifier.reports)
    with open(os.path.join(out, f"worker-{topo.worker_index}.json"), "w") as f:
        json.dump(record, f, indent=1)

    # Every worker takes part in the collective; the chief reports.
    head = np.frombuffer(bytes.fromhex(record["final_sha256"])[:16], dtype=np.int64)
    gathered = collective.all_gather(head, model.distribute_strategy)
    epochs_run = collective.all_gather(np.array([len(record["epochs"])]), model.distribute_strategy)
    summary = {
        "workers": int(gathered.shape[0]),
        "same_final_weights": bool((gathered == gathered[0]).all()),
        "epochs_run": epochs_run[:, 0].tolist(),
        "first_epoch": record["epochs"][0] if record["epochs"] else None,
        "verifier_checks": record["verifier_checks"],
        "verifier_mismatches": record["verifier_mismatches"],
        "out": out,
    }
    if topo.is_chief:
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
