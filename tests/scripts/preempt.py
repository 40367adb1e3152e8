"""A small training script stopped by a signal and resumed (`tests/*/test_preemption.py`).

    kmp-launch -n 2 tests/scripts/preempt.py BACKUP_DIR OUT [--signal-at E:B:W] [--mark-at E:B]

Trains a Dense-Dropout-Dense model with Adam on shuffled arrays, seeded, with
`kmp.callbacks.BackupAndRestore(BACKUP_DIR)`; the chief saves the final weights
(concatenated) to OUT.npy and the epochs begun, batches trained, `fit`'s seconds
(`fit_s`) and each epoch's (`epoch_s`, from its start to its end) to OUT.json.
`--signal-at E:B:W`: worker W sends itself SIGTERM after batch B of epoch E (0-based), and
writes the time to OUT.signalled.
`--kill-at E:B:W`: worker W sends itself SIGKILL there instead. Both only in the
job's first run (`KMP_RESTART` unset or 0: a restart by `--max-restarts` trains on).
`--mark-at E:B`: the chief writes OUT.mark after batch B of epoch E (a test then
signals the launcher). `--no-backup`: no BackupAndRestore. `--no-stop-signals`:
`stop_signals=None`. `--stop-check-interval S`: BackupAndRestore's (its default if not
given; 0: the workers check at every step, so the stop is at the batch after the signal).
`--progress`: each worker writes OUT.progress-W ("epoch batch") at each batch end
(`benchmarks/preemption.py`). `--plain`: no callback of the script's own (whose batch-end
hooks make Keras run every batch-end hook on the training thread); `--sync-hook` adds one
that does nothing (what running them there costs). `--dropout-seed none`: an unseeded
Dropout (on torch it draws from torch's global generator). `--spe N`:
`steps_per_execution=N`. `--hooks`: the chief records, in OUT.json's "hooks", every batch
hook its callbacks saw: `[epoch, "begin" | "end", batch, sorted logs keys]`. `--csv PATH`:
Keras's `CSVLogger(PATH)` (one file for a run and its rerun). OUT.json's "loss" is the last epoch's loss. Any backend.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import keras
import numpy as np

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import BackupAndRestore

parser = argparse.ArgumentParser()
parser.add_argument("backup_dir")
parser.add_argument("out")
parser.add_argument("--signal-at", default="")
parser.add_argument("--kill-at", default="")
parser.add_argument("--mark-at", default="")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--rows", type=int, default=96)
parser.add_argument("--no-backup", action="store_true")
parser.add_argument("--slow", type=float, default=0.0, help="seconds of sleep per batch")
parser.add_argument("--save-freq", default="epoch")
parser.add_argument("--dropout", type=float, default=0.25)
parser.add_argument("--dropout-seed", default="3")
parser.add_argument("--spe", type=int, default=1)
parser.add_argument("--hooks", action="store_true")
parser.add_argument("--csv", default=None)
parser.add_argument("--no-shuffle", action="store_true")
parser.add_argument("--no-stop-signals", action="store_true")
parser.add_argument("--stop-check-interval", type=float, default=None)
parser.add_argument("--plain", action="store_true")
parser.add_argument("--sync-hook", action="store_true")
parser.add_argument("--progress", action="store_true",
                    help="each worker writes OUT.progress-W (epoch batch) at each batch end")
args = parser.parse_args()

keras.utils.set_random_seed(7)
dropout_seed = None if args.dropout_seed == "none" else int(args.dropout_seed)


@kmp.parallelize
def build():
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(16, activation="relu",
                           kernel_initializer=keras.initializers.GlorotUniform(1)),
        keras.layers.Dropout(args.dropout, seed=dropout_seed),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2)),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse",
                  steps_per_execution=args.spe)
    return model


rng = np.random.default_rng(11)
x = rng.normal(size=(args.rows, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 1)) + 0.1).astype("float32")
worker = kmp.topology().worker_index


def point(text):
    return tuple(int(v) for v in text.split(":")) if text else None


first_run = os.environ.get("KMP_RESTART", "0") == "0"
signal_at, kill_at = point(args.signal_at) if first_run else None, point(args.kill_at) if first_run else None
mark_at = point(args.mark_at)


class Events(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.epochs, self.batches, self.hooks = [], 0, []

    def on_train_batch_begin(self, batch, logs=None):
        if args.hooks:
            self.hooks.append([self.epoch, "begin", batch, sorted(logs or {})])

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if args.hooks:
            self.hooks.append([self.epoch, "end", batch, sorted(logs or {})])
        if args.slow:
            time.sleep(args.slow)
        if signal_at and (self.epoch, batch, worker) == signal_at:
            with open(args.out + ".signalled", "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGTERM)
        if kill_at and (self.epoch, batch, worker) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if mark_at and (self.epoch, batch) == mark_at and worker == 0:
            with open(args.out + ".mark", "w") as f:
                f.write(str(time.time()))


class Progress(keras.callbacks.Callback):
    """Where this worker's training is: written at each batch end, before BackupAndRestore's
    check (which raises at the batch it stops at)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        with open(f"{args.out}.progress-{worker}", "w") as f:
            f.write(f"{self.epoch} {batch}")


class EpochTimes(keras.callbacks.Callback):
    """Each epoch's seconds (no batch hook: Keras's dispatch of batch hooks is unchanged)."""

    def on_train_begin(self, logs=None):
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.began)


class SyncHook(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


events = Events()
model = build()
began = time.perf_counter()
save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
interval = ({} if args.stop_check_interval is None
            else {"stop_check_interval": args.stop_check_interval})
backup = BackupAndRestore(args.backup_dir, save_freq=save_freq,
                          stop_signals=None if args.no_stop_signals else ("SIGTERM", "SIGUSR1"),
                          **interval)
epoch_times = EpochTimes()
callbacks = [epoch_times, *([] if args.no_backup else [backup]), *([] if args.plain else [events])]
if args.progress:
    callbacks.insert(0, Progress())
if args.sync_hook:
    callbacks.append(SyncHook())
if args.csv:  # first: its on_train_begin runs before BackupAndRestore restores
    callbacks.insert(0, keras.callbacks.CSVLogger(args.csv))
history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
                    shuffle=not args.no_shuffle, verbose=0, callbacks=callbacks)
seconds = time.perf_counter() - began
weights = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])
if worker == 0:
    np.save(args.out + ".npy", weights)
    with open(args.out + ".json", "w") as f:
        json.dump({"epochs": getattr(events, "epochs", None),
                   "batches": getattr(events, "batches", None), "fit_s": seconds,
                   "epoch_s": epoch_times.seconds,
                   "loss": float(history.history["loss"][-1]),
                   "hooks": getattr(events, "hooks", None)}, f)
