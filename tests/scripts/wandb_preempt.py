"""A W&B-logged training script stopped by a signal and resumed (`tests/integration/test_wandb_preemption.py`).

    kmp-launch -n 2 tests/scripts/wandb_preempt.py BACKUP_DIR WANDB_DIR [--signal-at E:B:W]

Trains a small model with `kmp.callbacks.BackupAndRestore(BACKUP_DIR)`,
`kmp.callbacks.DeviceMetricsLogger` and `WandbLogger` (offline, in WANDB_DIR; batch logs
every batch). `--signal-at E:B:W`: worker W sends itself SIGTERM after batch B of epoch E
(0-based), in the job's first run only (`KMP_RESTART` unset or 0); the workers check for a
signal at every step (`stop_check_interval=0`), so they stop after that batch.
"""

from __future__ import annotations

import argparse
import os
import signal

import keras
import numpy as np

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.integrations.wandb import WandbLogger

parser = argparse.ArgumentParser()
parser.add_argument("backup_dir")
parser.add_argument("wandb_dir")
parser.add_argument("--signal-at", default="")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

keras.utils.set_random_seed(7)
BATCH, ROWS = 16, 96


@kmp.parallelize
def build():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


rng = np.random.default_rng(11)
x = rng.normal(size=(ROWS, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 1))).astype("float32")
worker = kmp.topology().worker_index
first_run = os.environ.get("KMP_RESTART", "0") == "0"
signal_at = tuple(int(v) for v in args.signal_at.split(":")) if args.signal_at and first_run else None


class SignalAt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if signal_at == (self.epoch, batch, worker):
            os.kill(os.getpid(), signal.SIGTERM)


model = build()
model.fit(x, y, batch_size=BATCH, epochs=args.epochs, shuffle=False, verbose=0, callbacks=[
    SignalAt(),
    kmp.callbacks.BackupAndRestore(args.backup_dir, stop_check_interval=0),  # stop at that step
    kmp.callbacks.DeviceMetricsLogger(batch_size=BATCH, sample_interval=None, summary=False),
    WandbLogger(project="kmp-preemption", dir=args.wandb_dir, log_freq=1),
])
