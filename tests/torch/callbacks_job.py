"""What each process of the torch callback tests runs (`kmp.launch`, 2 processes).

`main_job(folder)` trains a tiny model under `@kmp.parallelize` with every kmp
callback and reports what this process saw and did: the weights, the files it
wrote through the atomic writer, the epochs it ran, the errors it raised.
"""

from __future__ import annotations

import os
import time

import numpy as np

import keras_mgpu_plugins as kmp

ROWS, FEATURES, BATCH, EPOCHS = 32, 4, 8, 3
#: The monitored value EarlyStopping sees, per process: the chief's decides.
CHIEF_VALUES = [3.0, 1.0, 2.0, 2.5, 0.5]  # best at epoch 1; patience 2 stops after epoch 3
OTHER_VALUES = [3.0, 2.0, 1.0, 0.5, 0.2]  # would never stop


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    return x, (x @ rng.normal(size=(FEATURES, 1)) + 0.1).astype("float32")


def build():
    import keras

    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(6, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def reference_weights(epochs=EPOCHS):
    """Plain Keras, one device, the same global batches."""
    model = build()
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


def record_writes():
    """Every path this process writes through kmp's atomic writer (outside the launcher's job
    folder, where the launcher's StallWatchdog keeps its heartbeats)."""
    from keras_mgpu_plugins.io import atomic as _atomic

    writes, real, job_dir = [], _atomic.atomic_write, os.environ.get("KMP_JOB_DIR")

    def recording(path, write, suffix=""):
        if not (job_dir and path.startswith(job_dir)):
            writes.append(os.path.basename(path))
        return real(path, write, suffix)

    _atomic.atomic_write = recording
    return writes


def callbacks_fit(folder, writes):
    import keras

    from keras_mgpu_plugins.callbacks import (
        DeviceMetricsLogger,
        ModelCheckpoint,
        WeightSyncVerifier,
    )
    from keras_mgpu_plugins.integrations.wandb import WandbLogger

    class Timing(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.keys = sorted(logs)

    verifier, timing = WeightSyncVerifier(), Timing()
    model = kmp.parallelize(build)()
    x, y = data()
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[
        verifier,
        ModelCheckpoint(os.path.join(folder, "ckpt-{epoch}.keras")),
        ModelCheckpoint(os.path.join(folder, "async.weights.h5"), save_weights_only=True,
                        async_save=True),
        DeviceMetricsLogger(batch_size=BATCH, csv_path=os.path.join(folder, "metrics.csv"),
                            summary=False, sample_interval=None),
        WandbLogger(project="kmp-torch", dir=folder, log_checkpoints=False),
        timing,
    ])
    return {"weights": model.get_weights(), "writes": sorted(set(writes)),
            "loss": history.history["loss"], "log_keys": timing.keys,
            "checks": [(r.where, len(r.mismatches)) for r in verifier.reports],
            "replicas": verifier._tracked.replicas, "checked": list(verifier._tracked.paths)}


def batchnorm_checked(rank):
    """BatchNormalization, DDP's default (each process's own statistics): the verifier finds
    every variable identical on both processes, moving statistics included (rank 0's)."""
    import keras

    from keras_mgpu_plugins.callbacks import WeightSyncVerifier

    @kmp.parallelize
    def build_bn():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(6),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
        return model

    verifier = WeightSyncVerifier(statistics=())  # moving statistics checked as weights
    model = build_bn()
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[verifier])
    return {"bn_checks": [(r.where, len(r.mismatches)) for r in verifier.reports],
            "bn_weights": model.get_weights()}


def early_stopping_fit(rank):
    import keras

    from keras_mgpu_plugins.callbacks import EarlyStopping

    values = CHIEF_VALUES if rank == 0 else OTHER_VALUES

    class Monitor(keras.callbacks.Callback):  # a value no one reduces: it differs per process
        def on_epoch_end(self, epoch, logs=None):
            logs["watched"] = values[epoch]
            self.weights.append(self.model.get_weights())

        def on_train_begin(self, logs=None):
            self.weights, self.epochs = [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(epoch)

    monitor = Monitor()
    stopper = EarlyStopping(monitor="watched", mode="min", patience=2, restore_best_weights=True)
    model = kmp.parallelize(build)()
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=len(CHIEF_VALUES), shuffle=False, verbose=0,
              callbacks=[monitor, stopper])
    return {"es_epochs": monitor.epochs, "es_stopped": stopper.stopped_epoch,
            "es_best_epoch_weights": monitor.weights[1], "es_weights": model.get_weights()}


def corrupted_fit(rank, corrupt_rank):
    """Process `corrupt_rank`'s copy of the first kernel nudged after epoch 1."""
    import keras

    from keras_mgpu_plugins.callbacks import WeightSyncVerifier

    class Nudge(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0 and rank == corrupt_rank:
                kernel = self.model.trainable_variables[0]
                kernel.assign(kernel.numpy() + 1e-3)

    model = kmp.parallelize(build)()
    x, y = data()
    try:
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                  callbacks=[Nudge(), WeightSyncVerifier()])
        return {"sync_error": "no error"}
    except kmp.WeightsOutOfSyncError as err:
        return {"sync_error": str(err)}


def chief_only_checkpoint(folder, rank):
    from keras_mgpu_plugins.callbacks import ModelCheckpoint
    from keras_mgpu_plugins.runtime import SettingsDifferError

    model = kmp.parallelize(build)()
    x, y = data()
    given = [ModelCheckpoint(os.path.join(folder, "chief-only.keras"))] if rank == 0 else []
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=given)
        return {"differ_error": "no error"}
    except SettingsDifferError as err:
        return {"differ_error": str(err)}


def main_job(folder):
    """Every check that lets the job go on, in one job; what this process saw."""
    import torch.distributed as dist

    writes = record_writes()
    rank = kmp.runtime.of().worker_index
    results = {"rank": rank, "processes": dist.get_world_size()}
    results.update(callbacks_fit(folder, writes))
    results.update(early_stopping_fit(rank))
    results.update(corrupted_fit(rank, corrupt_rank=dist.get_world_size() - 1))
    results.update(batchnorm_checked(rank))
    results.update(chief_only_checkpoint(folder, rank))
    try:
        kmp.multi_gpu_model(None, gpus=2)
    except NotImplementedError as err:
        results["multi_gpu_error"] = str(err)
    return results


def backup_job(folder, kill_epoch=None, seed=7):
    """BackupAndRestore of a shuffled fit; `kill_epoch`: process 1 SIGKILLs itself at that
    epoch's 2nd batch (the resumed epochs must see the rows in the uninterrupted order)."""
    import signal

    import keras

    from keras_mgpu_plugins.callbacks import BackupAndRestore

    rank = kmp.runtime.of().worker_index

    class Run(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(epoch)
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if rank == 1 and self.epoch == kill_epoch and batch == 1:
                os.kill(os.getpid(), signal.SIGKILL)

    writes = record_writes()
    run = Run()
    model = kmp.parallelize(build)()
    x, y = data()
    keras.utils.set_random_seed(seed)  # a resumed run draws another shuffle: the saved one wins
    model.fit(x, y, batch_size=BATCH, epochs=5, shuffle=True, verbose=0,
              callbacks=[BackupAndRestore(folder), run])
    return {"weights": model.get_weights(), "epochs": run.epochs, "writes": sorted(set(writes))}


def stall_job(timeout):
    """Process 1 hangs in its second epoch's end; StallWatchdog must fail the job."""
    import keras

    from keras_mgpu_plugins.callbacks import StallWatchdog

    rank = kmp.runtime.of().worker_index

    def sleep_forever_in_epoch_end():
        while True:
            time.sleep(1)

    class Hang(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if rank == 1 and epoch == 1:
                sleep_forever_in_epoch_end()

    model = kmp.parallelize(build)()
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0,
              callbacks=[StallWatchdog(timeout=timeout), Hang()])
    return "fit returned"
