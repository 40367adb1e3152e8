"""Throughput in bf16 at batch sizes that fill the GPU: kmp with all its callbacks against
plain Keras-JAX with none, and model FLOPs utilisation against this run's bf16 matmul rate.

Per model (`models.py`: a ResNet-18 of 32x32 images, a small GPT-style transformer), the
kmp side is `@kmp.parallelize` (DataParallel over the device) with every kmp callback at
its defaults (`ModelCheckpoint` and `BackupAndRestore` saving at each epoch's end); the
plain side is the same factory undecorated, `fit` without callbacks. After one warm-up
fit each (compilation), a short fit sets the steps per timed fit (`fit_seconds`), then
`rounds` rounds time one fit of each side (order alternating). Two ratios, medians over
the rounds, kmp / plain samples per second:

- `ratio_steps` (the goal, >= 0.99): the kmp fit's time less what its callbacks spent
  in their epoch-level hooks (train/epoch begin and end: the saves and checks, whose
  share depends on the epoch's length), so per-step costs (batch hooks, background
  threads, kmp's input feeding) count, and once-per-epoch ones do not;
- `ratio_fit`: whole fits, each a 1-epoch fit of a few seconds, saves included;
- `ratio_bare`: the kmp model's fit without callbacks: what `@kmp.parallelize` costs alone.

Model FLOPs per step: 3x the forward pass's FLOPs (XLA's cost analysis of the lowered,
unoptimised forward pass at the training batch), so MFU = FLOPs per step x steps per
second / the bf16 matmul rate of the `ceilings` part; for the transformer also by the
usual formula (`_palm`: 6 x parameters + attention, per token).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time

import common

SIZES = {
    "gpu": {"resnet": {"batch": 1024, "image": 32, "widths": [64, 128, 256, 512], "blocks": 2},
            "transformer": {"batch": 64, "seq": 512, "dim": 512, "heads": 8, "depth": 6,
                            "vocab": 8192},
            "fit_seconds": 2.5, "rounds": 3, "min_steps": 20, "matmul_n": 8192},
    "cpu": {"resnet": {"batch": 4, "image": 8, "widths": [4], "blocks": 1},
            "transformer": {"batch": 2, "seq": 8, "dim": 8, "heads": 2, "depth": 1,
                            "vocab": 16},
            "fit_seconds": 0.2, "rounds": 1, "min_steps": 3, "matmul_n": 128},
}
#: Hooks called once per step or more: their time stays in `ratio_steps`.
BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def run(rec: common.Recorder, size: dict) -> None:
    import keras
    import models

    rec.put(policy=models.POLICY, keras_backend=keras.backend.backend())
    for kind in ("resnet", "transformer"):
        with rec.step(kind):
            rec.put(**{kind: compare(kind, size, flops=True)})
    with rec.step("bf16_matmul"):
        rate = common.ceiling("bf16_matmul_tflops",
                              lambda: common.bf16_matmul_tflops(size["matmul_n"])["tflops"])
        rec.put(bf16_matmul_tflops=rate)
        for kind in ("resnet", "transformer"):
            found = rec.result.get(kind)
            for flops_key, suffix in (("train_flops_per_step", ""),
                                      ("train_flops_per_step_palm", "_palm")):
                if not (found and found.get(flops_key)):
                    continue
                for side in ("kmp", "kmp_bare", "plain"):
                    steps_per_s = found[f"{side}_samples_per_s"] / size[kind]["batch"]
                    found[f"mfu_{side}{suffix}"] = found[flops_key] * steps_per_s / (rate * 1e12)
        rec.flush()


def all_callbacks(folder: str, batch: int) -> list:
    """Every kmp callback at its defaults (monitoring the training loss)."""
    import keras_mgpu_plugins as kmp

    cb = kmp.callbacks
    return [cb.ModelCheckpoint(os.path.join(folder, "model.keras"), monitor="loss"),
            cb.BackupAndRestore(os.path.join(folder, "backup")),
            cb.EarlyStopping(monitor="loss", patience=100),
            cb.DeviceMetricsLogger(batch_size=batch, summary=False),
            cb.WeightSyncVerifier(),
            cb.StallWatchdog()]


def timed_hooks(callbacks: list, spent: dict[str, float]) -> list:
    """Wraps each hook a callback overrides; their time adds up in `spent["batch"]` (per-step
    hooks) and `spent["epoch"]` (the others)."""
    import keras

    for callback in callbacks:
        for name in dir(keras.callbacks.Callback):
            hook = getattr(callback, name)
            if not name.startswith("on_") or getattr(hook, "__func__", None) is getattr(
                    keras.callbacks.Callback, name):
                continue
            key = "batch" if name in BATCH_HOOKS else "epoch"

            def wrapped(*args, _hook=hook, _key=key, **kwargs):
                start = time.perf_counter()
                try:
                    return _hook(*args, **kwargs)
                finally:
                    spent[_key] += time.perf_counter() - start

            setattr(callback, name, wrapped)
    return callbacks


def compare(kind: str, size: dict, flops: bool) -> dict:
    """kmp + callbacks vs plain for model `kind`: samples/s, ratios, FLOPs per step.

    A third side, `kmp_bare` (the kmp model's `fit` without callbacks), tells what
    `@kmp.parallelize` costs apart from what the callbacks cost.
    """
    import models

    import keras_mgpu_plugins as kmp

    shape = size[kind]
    batch, build = shape["batch"], models.factory(kind, shape)
    xs, ys = models.inputs(kind, shape)
    built = {"kmp": kmp.parallelize(build)(), "plain": build()}
    found: dict = {"model": kind, "size": shape, "parameters": built["plain"].count_params()}
    if flops:
        found.update(forward_flops(built["plain"], xs[0]))
    if kind == "transformer":
        found.update(transformer_flops(built["plain"], shape))
    with tempfile.TemporaryDirectory(prefix="kmp-gpu-fit-") as folder:
        count = iter(range(10**6))

        def fit(side: str, steps: int) -> tuple[float, dict]:
            spent = {"batch": 0.0, "epoch": 0.0}
            callbacks = (timed_hooks(all_callbacks(os.path.join(folder, str(next(count))), batch),
                                     spent) if side == "kmp" else [])
            model = built["plain" if side == "plain" else "kmp"]
            start = time.perf_counter()
            model.fit(models.Batches(xs, ys, steps), epochs=1, verbose=0, callbacks=callbacks)
            return time.perf_counter() - start, spent

        # Two warm-up fits each: a DataParallel of one device compiled the train step again
        # at the second epoch (its metrics' variables, reset, lose their mesh type; plain
        # Keras DataParallel too, JAX 0.10). kmp on one device now trains as plain Keras
        # does, with no distribution (tests/jax/test_compilations.py counts them).
        first = {side: [fit(side, size["min_steps"])[0] for _ in range(2)] for side in built}
        probe = fit("plain", size["min_steps"])[0] / size["min_steps"]
        steps = max(size["min_steps"], int(size["fit_seconds"] / probe))
        found.update(first_fit_s=first, steps_per_fit=steps, seconds_per_step_probe=probe)
        walls: dict[str, list[float]] = {"kmp": [], "kmp_bare": [], "plain": []}
        hooks: dict[str, list[float]] = {"batch": [], "epoch": []}
        for r in range(size["rounds"]):
            order = list(walls) if r % 2 == 0 else list(walls)[::-1]
            for side in order:
                wall, spent = fit(side, steps)
                walls[side].append(wall)
                if side == "kmp":
                    for key in hooks:
                        hooks[key].append(spent[key])
    samples = batch * steps
    found.update({f"{side}_samples_per_s": samples / statistics.median(w)
                  for side, w in walls.items()})
    found.update({f"{side}_fit_s": w for side, w in walls.items()})
    found.update(
        kmp_batch_hooks_s=hooks["batch"], kmp_epoch_hooks_s=hooks["epoch"],
        ratio_fit=statistics.median(p / k for k, p in zip(walls["kmp"], walls["plain"], strict=True)),
        ratio_steps=statistics.median(p / (k - e) for k, p, e in zip(
            walls["kmp"], walls["plain"], hooks["epoch"], strict=True)),
        ratio_bare=statistics.median(p / b for b, p in zip(walls["kmp_bare"], walls["plain"],
                                                           strict=True)),
        goal_ratio_steps=0.99)
    return found


def transformer_flops(model, shape: dict) -> dict:
    """The usual count for a decoder (PaLM, appendix B): per token, 6 x the parameters that
    multiply (all but the input embeddings and positions) + 12 x depth x seq x dim for
    attention. XLA's cost analysis may not count an attention the GPU runs as one fused
    cuDNN call; this count does."""
    tables = sum(math.prod(v.shape) for v in model.weights  # any backend's variables
                 if v.path.endswith(("embeddings", "positions")))
    tokens = shape["batch"] * shape["seq"]
    per_token = 6 * (model.count_params() - tables) + 12 * shape["depth"] * shape["seq"] * shape["dim"]
    return {"train_flops_per_step_palm": float(per_token * tokens)}


def forward_flops(model, x) -> dict:
    """XLA's FLOPs of one forward pass at this batch (training mode), and 3x that per step."""
    import jax

    trainable = [v.value for v in model.trainable_variables]
    other = [v.value for v in model.non_trainable_variables]
    forward = jax.jit(lambda t, o, batch: model.stateless_call(t, o, batch, training=True)[0])
    cost = forward.lower(trainable, other, x).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # older JAX: one per module
    return {"forward_flops": float(cost["flops"]), "train_flops_per_step": 3 * float(cost["flops"]),
            "flops_how": "3 x XLA's cost analysis of the lowered forward pass (training=True)"}
