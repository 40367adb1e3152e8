"""How long training is blocked per checkpoint: `async_save=False` vs `True`.

Trains the same model (weights >= 50 MB; the `.keras` file also holds Adam's
two slots, so about three times that) with `kmp.callbacks.ModelCheckpoint`
saving at every epoch end (or, with `--backup`, `kmp.callbacks.BackupAndRestore`
backing up at every epoch end), once synchronously and once with
`async_save=True`, alternating the two for `--repeats` fits each. "Blocked" is the time the
training thread spends inside the callback's hooks for one save: its
`on_epoch_end` plus the hooks until the next save (where an async save may
wait for the previous write), and `on_train_end` for the last one. Prints the
median blocked time per save of each mode and their ratio, measured in this
one run.

    python benchmarks/checkpoint_async.py [--quick] [--epochs 4] [--repeats 2] [--weights-only]
        [--backup] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from _suite import Report, add_arguments

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def timed_checkpoint(base: type, **kwargs):
    """A ModelCheckpoint that records the time spent in each of its hooks."""

    class Timed(base):
        def __init__(self) -> None:
            super().__init__(**kwargs)
            self.per_save: list[float] = []

        def _time(self, hook, *args, new_save=False):
            start = time.perf_counter()
            hook(*args)
            spent = time.perf_counter() - start
            if new_save:
                self.per_save.append(spent)
            elif self.per_save:  # hooks after a save may wait for its write
                self.per_save[-1] += spent

        def on_epoch_begin(self, epoch, logs=None):
            self._time(super().on_epoch_begin, epoch, logs)

        def on_train_batch_end(self, batch, logs=None):
            self._time(super().on_train_batch_end, batch, logs)

        def on_epoch_end(self, epoch, logs=None):
            self._time(super().on_epoch_end, epoch, logs, new_save=True)

        def on_train_end(self, logs=None):
            self._time(super().on_train_end, logs)

    return Timed()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=None)
    parser.add_argument("--epochs", type=int, default=4, help="saves per fit")
    parser.add_argument("--repeats", type=int, default=2, help="fits per mode")
    parser.add_argument("--steps", type=int, default=16, help="training steps per epoch")
    parser.add_argument("--width", type=int, default=4096, help="hidden units")
    parser.add_argument("--weights-only", action="store_true", help="save .weights.h5")
    parser.add_argument("--backup", action="store_true", help="time BackupAndRestore instead")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.repeats, args.steps, args.width = 2, 1, 2, 64

    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((2048,)),
                keras.layers.Dense(args.width, activation="relu"),
                keras.layers.Dense(2048),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
        return model

    batch = 16
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * args.steps, 2048)).astype("float32")
    y = rng.normal(size=(batch * args.steps, 2048)).astype("float32")
    model = build()
    weights_mb = sum(w.nbytes for w in model.get_weights()) / 1e6
    name = "bench.weights.h5" if args.weights_only or args.backup else "bench.keras"
    blocked: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(dir=os.getcwd(), prefix=".bench-") as folder:
        path = os.path.join(folder, name)
        for repeat in range(args.repeats):
            for async_save in (False, True):
                if args.backup:  # a fresh folder per fit: nothing to restore
                    path = os.path.join(folder, f"backup-{repeat}-{async_save}", "latest.weights.h5")
                    callback = timed_checkpoint(
                        kmp.callbacks.BackupAndRestore, backup_dir=os.path.dirname(path),
                        delete_checkpoint=False, async_save=async_save,
                    )
                else:
                    callback = timed_checkpoint(
                        kmp.callbacks.ModelCheckpoint,
                        filepath=path,
                        save_weights_only=args.weights_only,
                        async_save=async_save,
                    )
                model.fit(
                    x,
                    y,
                    batch_size=batch,
                    epochs=args.epochs,
                    verbose=0,
                    shuffle=False,
                    callbacks=[callback],
                )
                assert len(callback.per_save) == args.epochs
                blocked[async_save] += callback.per_save
        file_mb = os.path.getsize(path) / 1e6
    sync = statistics.median(blocked[False])
    asyn = statistics.median(blocked[True])
    what = "BackupAndRestore" if args.backup else "ModelCheckpoint"
    print(f"{what}; model weights: {weights_mb:.1f} MB; file: {file_mb:.1f} MB")
    print(f"saves per mode: {len(blocked[False])} ({args.repeats} fits x {args.epochs} epochs)")
    print(f"training blocked per save, sync  (median): {sync * 1e3:8.1f} ms")
    print(f"training blocked per save, async (median): {asyn * 1e3:8.1f} ms")
    report = Report("checkpoint_async", f"{what}: training blocked per save, async_save=True "
                    "against synchronous saves", args.quick)
    report.ratio("async", f"{what}: time blocked per save, synchronous / async_save=True",
                 sync / asyn, None, [],
                 f"{'.weights.h5' if args.weights_only or args.backup else '.keras'} file of "
                 f"{file_mb:.1f} MB, median of {len(blocked[False])} saves per mode "
                 f"({args.repeats} fits x {args.epochs} epochs each, alternating)")
    report.row("synchronous save, training blocked", sync * 1e3, "ms")
    report.row("async_save=True, training blocked", asyn * 1e3, "ms")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
