"""The one program every cell of the conformance table runs, on every lane and every start.

A user's script, as they write it: a `@kmp.parallelize`d factory, numpy data, `fit` with
kmp's callbacks and Keras's own `CSVLogger`, then `evaluate` and `predict`. It runs
unchanged as one process on one device (the reference), on 2 devices of one process
(`--devices 2`), and as every worker of a job however the job was started (kmp-launch,
`kmp.launch`, the scheduler runner, TF_CONFIG by hand, torchrun). Each process writes what
it saw to `<out>/results/<phase>-w<rank>.json`: History, weights (exact floats), evaluate,
predict, the batch hooks its callbacks received, and every write it made under `<out>`
(an audit hook: Python-level opens for writing and renames).

Phases (`--phases`, default all): `main` (the resumable fit: `BackupAndRestore`,
`ModelCheckpoint`, `CSVLogger`), `early` (`EarlyStopping` with `restore_best_weights`),
`uneven` (a global batch of 7 on 15 rows) and `tiny` (a data set of one row).

Events (`--at EPOCH:BATCH:WHAT:WORKER`, several allowed) make the run go wrong on
purpose at the start of that batch of the `main` fit, on that worker only: `SIGTERM`,
`SIGUSR1` or `SIGKILL` sent to itself, `raise` (a `ValueError`), `stall` (sleeps for an
hour: a `StallWatchdog(timeout=--stall-timeout)` is then in the fit).
`--undecorated` builds the model without `@kmp.parallelize` (kmp's callbacks kept).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence

import numpy as np

FEATURES, CLASSES = 6, 3
ROWS, BATCH, EPOCHS, SAVE_FREQ = 48, 8, 3, 2
STOP_CHECK_S = 1e-4  # BackupAndRestore's stop_check_interval: under one step
PHASES = ("main", "early", "uneven", "tiny")


def data(rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = (x[:, :CLASSES] + 0.3 * rng.normal(size=(rows, CLASSES))).argmax(1).astype("int32")
    return x, y


def build(decorated: bool = True):
    """The user's factory, decorated as the README says (or not, `--undecorated`)."""
    import keras

    import keras_mgpu_plugins as kmp

    def build_model():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((FEATURES,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return kmp.parallelize(build_model)() if decorated else build_model()


def rank() -> int:
    import keras_mgpu_plugins as kmp

    return kmp.topology().worker_index


class Writes:
    """Every Python-level write of this process under `folder` (but `results/`)."""

    def __init__(self, folder: str) -> None:
        self.folder, self.seen = os.path.abspath(folder), []
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str):
            mode, flags = args[1] or "", args[2] or 0
            if any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                self._note(args[0])
        elif event == "os.rename":
            self._note(str(args[1]))

    def _note(self, path: str) -> None:
        path = os.path.abspath(path)
        if path.startswith(self.folder + os.sep):
            relative = os.path.relpath(path, self.folder)
            if not relative.startswith("results"):
                self.seen.append(relative)

    def names(self) -> list[str]:
        return sorted({p for p in self.seen if ".tmp" not in p and "kmp-tmp" not in p})


def recorder(events: Sequence[str], log: list, out: str):
    """The test's eyes in the `main` fit: every batch hook (epoch, index, log keys, loss)
    and epoch end, and the events to act out (the hooks saved before a SIGKILL: a killed
    process runs no `finally`)."""
    import keras

    wanted = [e.split(":") for e in events]

    class Recorder(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            for when_epoch, when_batch, what, worker in wanted:
                if (int(when_epoch), int(when_batch), int(worker)) == (self.epoch, batch, rank()):
                    if what == "SIGKILL":
                        save(out, "hooks", {"hooks": log})
                    act(what)

        def on_train_batch_end(self, batch, logs=None):
            logs = logs or {}
            log.append({"epoch": self.epoch, "batch": batch, "keys": sorted(logs),
                        "loss": float(logs["loss"]) if "loss" in logs else None})

        def on_epoch_end(self, epoch, logs=None):
            log.append({"epoch_end": epoch, "logs": {k: float(v) for k, v in (logs or {}).items()}})

    return Recorder()


def act(what: str) -> None:
    if what in ("SIGTERM", "SIGUSR1", "SIGKILL"):
        os.kill(os.getpid(), getattr(signal, what))
        if what == "SIGKILL":
            time.sleep(60)
    elif what == "raise":
        raise ValueError(f"worker {rank()} broke on purpose")
    elif what == "stall":
        time.sleep(3600)
    else:
        raise SystemExit(f"unknown event {what!r}")


def weights(model) -> list:
    return [w.tolist() for w in model.get_weights()]


def main_phase(out: str, args: argparse.Namespace, writes: Writes) -> dict:
    import keras

    import keras_mgpu_plugins as kmp

    model = build(not args.undecorated)
    x, y = data()
    hooks: list = []
    callbacks = [
        recorder(args.at, hooks, out),  # first: it sees each batch end before a stop raises
        # a check for stop signals before every step (the default checks every K steps, at
        # most 2 s apart: a stop after this job's last step; tests/multi_worker/
        # test_stop_at_defaults.py holds the default's bound)
        kmp.callbacks.BackupAndRestore(os.path.join(out, "backup"), save_freq=SAVE_FREQ,
                                       stop_check_interval=STOP_CHECK_S),
        kmp.callbacks.ModelCheckpoint(os.path.join(out, "best.keras"), monitor="val_loss",
                                      save_best_only=True),
        keras.callbacks.CSVLogger(os.path.join(out, "history.csv")),
    ]
    if args.stall_timeout:
        callbacks.append(kmp.callbacks.StallWatchdog(timeout=args.stall_timeout))
    try:
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_split=0.25,
                            callbacks=callbacks, verbose=0)
    finally:
        save(out, "hooks", {"hooks": hooks})
    x_val = x[-ROWS // 4:]
    return {"history": history.history, "weights": weights(model),
            "evaluate": model.evaluate(x_val, y[-ROWS // 4:], batch_size=BATCH, verbose=0,
                                       return_dict=True),
            "predict": model.predict(x_val, batch_size=BATCH, verbose=0).tolist(),
            "hooks": hooks, "writes": writes.names()}


def early_phase(out: str, args: argparse.Namespace) -> dict:
    import keras_mgpu_plugins as kmp

    model = build(not args.undecorated)
    x, y = data()
    stop = kmp.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.02,
                                       restore_best_weights=True)
    history = model.fit(x, y, batch_size=BATCH, epochs=12, validation_split=0.25,
                        callbacks=[stop], verbose=0)
    return {"history": history.history, "weights": weights(model),
            "stopped_epoch": int(stop.stopped_epoch), "epochs_run": len(history.epoch)}


def small_phase(rows: int, batch: int, args: argparse.Namespace) -> dict:
    model = build(not args.undecorated)
    x, y = data(rows)
    try:
        history = model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    except Exception as err:  # noqa: BLE001 - a refusal is a result the test asserts
        return {"error": type(err).__name__, "message": str(err)}
    return {"history": history.history, "weights": weights(model),
            "predict": model.predict(x, batch_size=batch, verbose=0).tolist()}


def save(out: str, phase: str, found: dict) -> None:
    folder = os.path.join(out, "results")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{phase}-w{rank()}.json"), "w") as f:
        json.dump(found, f)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="job.py")
    parser.add_argument("--out", required=True)
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--devices", type=int, default=0)
    parser.add_argument("--at", action="append", default=[])
    parser.add_argument("--stall-timeout", type=float, default=0)
    parser.add_argument("--undecorated", action="store_true")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> str:
    """Runs the phases; returns `"done"` (what `kmp.launch` hands back)."""
    args = parse(argv)
    if args.devices:
        import keras_mgpu_plugins as kmp

        kmp.simulate_devices(args.devices)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    writes = Writes(out)
    for phase in args.phases.split(","):
        if phase == "main":
            found = main_phase(out, args, writes)
        elif phase == "early":
            found = early_phase(out, args)
        elif phase == "uneven":
            found = small_phase(15, 7, args)
        elif phase == "tiny":
            found = small_phase(1, 4, args)
        else:
            raise SystemExit(f"--phases: unknown phase {phase!r}; known: {', '.join(PHASES)}")
        save(out, phase, found)
    return "done"


if __name__ == "__main__":
    main(sys.argv[1:])
