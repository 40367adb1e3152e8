"""Checkpoints of a >= 1 GB model: how long the training thread is blocked per save.

The model (`@kmp.parallelize`, an MLP `features -> width -> features`: 2 x features x width
float32 parameters, 1.07 GB on the GPU) trains `epochs` epochs per mode, saving its
weights at each epoch's end, once per mode:

- `sync`: `kmp.callbacks.ModelCheckpoint(save_weights_only=True)`;
- `async`: the same with `async_save=True` (the copy to host on the training thread,
  the file written by a background thread);
- `orbax`: `keras.callbacks.OrbaxCheckpoint(save_weights_only=True, save_on_background=True)`.

"Blocked" is `checkpoint_async.timed_checkpoint`'s: the time spent inside the callback's
hooks per save, the hooks until the next save included (an async save may wait there for
the previous write). The async modes' epochs last about 1.5x a synchronous save, so that a
background write can end before the next one starts. Reported: each save's blocked time,
the median per mode, the ratios to `sync`, the files' size, where they were written.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import common

SIZES = {
    "gpu": {"features": 8192, "width": 16384, "batch": 64, "epochs": 3, "min_steps": 20},
    "cpu": {"features": 32, "width": 64, "batch": 8, "epochs": 3, "min_steps": 2},
}


def run(rec: common.Recorder, size: dict) -> None:
    import keras
    import numpy as np
    from checkpoint_async import timed_checkpoint
    from models import Batches

    import keras_mgpu_plugins as kmp

    @kmp.parallelize
    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((size["features"],)),
                                  keras.layers.Dense(size["width"], activation="relu"),
                                  keras.layers.Dense(size["features"])])
        model.compile(optimizer="adam", loss="mse")
        return model

    model = build()
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(4, size["batch"], size["features"])).astype("float32")
    folder = tempfile.mkdtemp(prefix="kmp-gpu-ckpt-")
    rec.put(weights_bytes=sum(int(v.value.nbytes) for v in model.weights), folder=folder,
            filesystem=filesystem(folder))
    steps = size["min_steps"]
    for _ in range(2):  # compiles (at both fits under a distribution: see part_throughput)
        model.fit(Batches(xs, xs, steps), epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(Batches(xs, xs, steps), epochs=1, verbose=0)
    step_s = (time.perf_counter() - start) / steps
    with rec.step("host_copy"):  # what async_save does on the training thread, alone
        rec.put(host_copy_s=common.median_seconds(
            lambda: [np.asarray(v.value) for v in model.weights], repeats=3))
    modes = {  # the callback's class, its arguments for a folder
        "sync": (kmp.callbacks.ModelCheckpoint, lambda path: {
            "filepath": os.path.join(path, "w.weights.h5"), "monitor": "loss",
            "save_weights_only": True}),
        "async": (kmp.callbacks.ModelCheckpoint, lambda path: {
            "filepath": os.path.join(path, "w.weights.h5"), "monitor": "loss",
            "save_weights_only": True, "async_save": True}),
        "orbax": (keras.callbacks.OrbaxCheckpoint, lambda path: {
            "directory": path, "monitor": "loss", "save_weights_only": True,
            "save_on_background": True}),
    }
    for mode, (base, arguments) in modes.items():
        with rec.step(mode) as step:
            if mode == "orbax" and importlib.util.find_spec("orbax") is None:
                step.update(status="skipped", message="orbax-checkpoint not installed")
                continue
            path = os.path.join(folder, mode)
            os.makedirs(path, exist_ok=True)
            callback = timed_checkpoint(base, **arguments(path))
            fit_start = time.perf_counter()
            model.fit(Batches(xs, xs, steps), epochs=size["epochs"], verbose=0,
                      callbacks=[callback])
            rec.put(**{mode: {"blocked_s": callback.per_save,
                              "median_blocked_s": statistics.median(callback.per_save),
                              "steps_per_epoch": steps, "fit_s": time.perf_counter() - fit_start,
                              "bytes_on_disk": tree_bytes(path)}})
            shutil.rmtree(path, ignore_errors=True)
            if mode == "sync":  # async epochs: long enough for one write to end
                steps = max(steps, int(1.5 * rec.result["sync"]["median_blocked_s"] / step_s))
    sync = rec.result.get("sync", {}).get("median_blocked_s")
    rec.put(step_s=step_s, ratios={f"sync / {m}": sync / rec.result[m]["median_blocked_s"]
                                   for m in ("async", "orbax") if sync and m in rec.result})
    shutil.rmtree(folder, ignore_errors=True)


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def filesystem(path: str) -> str:
    try:
        return subprocess.run(["df", "-hT", path], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        return f"df failed: {err}"
