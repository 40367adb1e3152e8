"""What each process of the JAX sharded-callback tests runs (`kmp.launch`), and the fits
shared with the in-process tests: EarlyStopping, WeightSyncVerifier, BackupAndRestore and
DeviceMetricsLogger on `strategy="model_parallel"` / `"hybrid"` (the model and data of
`model_parallel_job`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal

import numpy as np

from tests.jax import model_parallel_job as mp

EPOCHS = 8
#: Every variable of `hidden/kernel` (96, 32) split: rows over the processes ("batch"),
#: columns over each process's devices ("model"); no device holds a copy of another's.
ACROSS_PROCESSES = {"hidden/kernel": ("batch", "model")}


def validation():
    """Rows of the training set with 3 of their 6 tokens redrawn: the validation loss of
    Adam falls for 3 epochs, then rises (best epoch 2; patience 2 stops after epoch 4)."""
    x, y = mp.data()
    held = x[:16].copy()
    held[:, :3] = np.random.default_rng(5).integers(0, mp.VOCAB, size=(16, 3))
    return held, y[:16]


def layout(entries):
    if entries is None:
        return None
    import keras

    layout_map = keras.distribution.LayoutMap(None)
    for key, axes in entries.items():
        layout_map[key] = axes
    return layout_map


def early_stopping_fit(model, callbacks=()):
    """Adam, `kmp.callbacks.EarlyStopping(restore_best_weights=True)` on val_loss."""
    from keras_mgpu_plugins.callbacks import EarlyStopping

    stopper = EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    x, y = mp.data()
    model.fit(x, y, batch_size=mp.BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              validation_data=validation(), callbacks=[*callbacks, stopper])
    return {"stopped": stopper.stopped_epoch, "best": stopper.best_epoch,
            "weights": mp.weights(model), "shards": shards(model)}


def shards(model) -> dict:
    """Each variable's shapes on this process's devices (model and optimizer)."""
    return {named(v.path): [tuple(s.data.shape) for s in v.value.addressable_shards]
            for v in [*model.weights, *model.optimizer.variables]}


def named(path: str) -> str:
    """`path`, the optimizer's named `adam` (`adam_3` when several were built in a process)."""
    return re.sub(r"^adam_\d+/", "adam/", path)


def checked(verifier) -> dict:
    """What the verifier compares: `path + shard` -> this process's devices holding a copy."""
    tracked = verifier._tracked
    shards = getattr(tracked, "shards", [""] * len(tracked.paths))
    return {named(path) + shard: [r for r, c in enumerate(copies) if c is not None]
            for path, shard, copies in zip(tracked.paths, shards, tracked.copies, strict=True)}


def nudged_fit(strategy, variable, device):
    """WeightSyncVerifier; after epoch 1, the last process adds 1e-3 to its `device`-th
    buffer of `variable` (one copy of one shard). The error each process raised."""
    import jax
    import keras

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.backends.jax import replica_copies

    last = jax.process_index() == jax.process_count() - 1

    class Nudge(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0 and last:
                target = next(v for v in self.model.weights if v.path == variable)
                copy = replica_copies.local_copies(target)[device]
                replica_copies.assign(copy, replica_copies.host_value(copy) + 1e-3)

    model = kmp.parallelize(mp.build, strategy=strategy)(True)
    x, y = mp.data()
    try:
        model.fit(x, y, batch_size=mp.BATCH, epochs=2, shuffle=False, verbose=0,
                  callbacks=[Nudge(), kmp.callbacks.WeightSyncVerifier()])
        return "no error"
    except kmp.WeightsOutOfSyncError as err:
        return str(err)


class MetricsSeen:
    """A `DeviceMetricsLogger` writing `metrics-<rank>.csv` in `folder` (one name per process:
    process 0's file alone must appear), the logger's keys of each epoch's `logs` as a
    callback listed after it sees them, and the summary the chief printed."""

    def __init__(self, folder: str) -> None:
        import keras

        import keras_mgpu_plugins as kmp

        seen = self.logs = []

        class Logs(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                seen.append({k: float(v) for k, v in logs.items() if "/" in k})

        rank = kmp.runtime.of().worker_index
        self.callbacks = [kmp.callbacks.DeviceMetricsLogger(
            batch_size=mp.BATCH, csv_path=os.path.join(folder, f"metrics-{rank}.csv"),
            sample_interval=None), Logs()]
        self.printed = io.StringIO()

    def found(self) -> dict:
        return {"logs": self.logs, "summary": [line for line in self.printed.getvalue().splitlines()
                                               if line.startswith("Device metrics over")]}


def metrics_fit(model, folder: str, epochs: int = 2) -> dict:
    """`fit` with `MetricsSeen(folder)`: what the logger gave."""
    seen = MetricsSeen(folder)
    x, y = mp.data()
    with contextlib.redirect_stdout(seen.printed):
        model.fit(x, y, batch_size=mp.BATCH, epochs=epochs, shuffle=False, verbose=0,
                  callbacks=seen.callbacks)
    return seen.found()


def hybrid_job(entries=None, metrics_folder=None) -> dict:
    """strategy="hybrid" (this process: one of 2, 2 devices each): EarlyStopping with a
    WeightSyncVerifier checking each epoch, with kmp's layouts or `entries` as a
    layout_map; with kmp's layouts, a nudged copy of one shard too. With `metrics_folder`,
    a DeviceMetricsLogger in the EarlyStopping fit too (`MetricsSeen`)."""
    import keras_mgpu_plugins as kmp

    verifier = kmp.callbacks.WeightSyncVerifier()
    seen = MetricsSeen(metrics_folder) if metrics_folder else None
    model = kmp.parallelize(mp.build, strategy="hybrid", layout_map=layout(entries))(True)
    with contextlib.redirect_stdout(seen.printed) if seen else contextlib.nullcontext():
        found = early_stopping_fit(model, [*(seen.callbacks if seen else ()), verifier])
    if seen:
        found["metrics"] = seen.found()
    found["checks"] = [(r.where, len(r.mismatches)) for r in verifier.reports]
    found["checked"] = checked(verifier)
    if entries is None:
        found["nudged"] = nudged_fit("hybrid", "hidden/kernel", 1)
    return found


def backup_job(folder, kill_epoch=None, strategy="model_parallel") -> dict:
    """BackupAndRestore on one process; `kill_epoch`: SIGKILLs itself at that epoch's 2nd
    batch. `strategy=None`: plain Keras on this process's one device."""
    import jax
    import keras

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.backends.jax.values import host_value

    class Run(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(epoch)
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.epoch == kill_epoch and batch == 1:
                os.kill(os.getpid(), signal.SIGKILL)

    run = Run()
    model = (kmp.parallelize(mp.build, strategy=strategy) if strategy else mp.build)(True)
    x, y = mp.data()
    model.fit(x, y, batch_size=mp.BATCH, epochs=4, shuffle=False, verbose=0,
              callbacks=[kmp.callbacks.BackupAndRestore(folder), run])
    return {"epochs": run.epochs, "devices": len(jax.local_devices()),
            "weights": [host_value(v) for v in [*model.weights, *model.optimizer.variables]],
            "shards": shards(model)}
