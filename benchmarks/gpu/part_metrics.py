"""The keys `DeviceMetricsLogger` logs in a short fit on the device, whatever this tree has.

A small GPT-style transformer (`models.py`, `mixed_bfloat16`, token inputs, so that a
tokens-per-second key applies) built by `@kmp.parallelize`, 2 epochs with
`DeviceMetricsLogger(batch_size=...)` at its defaults (MFU against kmp's own peak table
where it has one). Every key of the last epoch's logs that the logger added is recorded
with its value, and each group of keys issue 44 asks for gets a verdict:

- `logged`: keys of the group are in the logs (the keys and their values);
- `landed, not logged in this fit`: the logger documents the group (its module's table of
  keys) but this fit has none of it (e.g. the straggler report needs several workers);
- `not landed`: the installed logger does not know the group (FLOP counting, MFU and the
  straggler report come with the `metrics` branch; the part runs before and after it).

Nothing fails on a missing group: the verdicts are the figures.
"""

from __future__ import annotations

import contextlib
import io

import common

SIZES = {
    "gpu": {"model": {"batch": 32, "seq": 256, "dim": 256, "heads": 4, "depth": 2, "vocab": 4096},
            "steps": 24, "epochs": 2},
    "cpu": {"model": {"batch": 2, "seq": 8, "dim": 8, "heads": 2, "depth": 1, "vocab": 16},
            "steps": 3, "epochs": 2},
}
#: Each group: the key prefixes (as the logger's module documents them) that belong to it.
GROUPS = {
    "flops": ("flops/", "throughput/tflops"),
    "mfu": ("efficiency/mfu",),
    "tokens": ("throughput/tokens",),
    "phases": ("phase/",),
    "straggler": ("straggler/",),
    "cost": ("cost/",),
}


def run(rec: common.Recorder, size: dict) -> None:
    import keras
    import models

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks import device_metrics_logger

    shape = size["model"]
    documented = device_metrics_logger.__doc__ or ""
    with rec.step("fit") as step:
        model = kmp.parallelize(models.factory("transformer", shape))()
        xs, ys = models.inputs("transformer", shape)
        with contextlib.redirect_stdout(io.StringIO()):  # its summary table, if any
            history = model.fit(models.Batches(xs, ys, size["steps"]), epochs=size["epochs"],
                                verbose=0, callbacks=[kmp.callbacks.DeviceMetricsLogger(
                                    batch_size=shape["batch"], summary=False)])
        logs = {key: values[-1] for key, values in history.history.items()}
        added = {k: v for k, v in sorted(logs.items()) if k != "loss"}  # Keras's own: the loss
        groups = verdicts(added, documented)
        rec.put(keras_backend=keras.backend.backend(), model="transformer", size=shape,
                steps_per_epoch=size["steps"], epochs=size["epochs"], keys=added,
                groups=groups, device=str(_device()),
                how="the last epoch's logs of fit(callbacks=[DeviceMetricsLogger(batch_size)])")
        if not added:
            step.update(status="failed", message="DeviceMetricsLogger added no key to the logs")


def verdicts(logged: dict, documented: str) -> dict[str, dict]:
    """Each group of `GROUPS`: `logged` (its keys in `logged`, with their values), `landed,
    not logged in this fit` (named in `documented`, the logger's table of keys, but not
    logged) or `not landed`."""
    found = {}
    for group, prefixes in GROUPS.items():
        keys = {k: v for k, v in logged.items() if any(p in k for p in prefixes)}
        if keys:
            found[group] = {"status": "logged", "keys": keys}
        elif any(p in documented for p in prefixes):
            found[group] = {"status": "landed, not logged in this fit", "keys": {}}
        else:
            found[group] = {"status": "not landed", "keys": {}}
    return found


def _device():
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.devices()[0]
    return keras.backend.backend()
