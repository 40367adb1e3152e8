"""What each kmp callback costs per step at its defaults, alone and all together, against a plain fit.

One job of 2 workers (`kmp.launch`; TensorFlow: `MultiWorkerMirroredStrategy`, JAX: 2
processes, torch: 2 gloo processes; `KERAS_BACKEND` chooses) trains one `@kmp.parallelize`
model (an MLP of two hidden layers, Adam, global batch 256) through a series of `fit`
calls of `--epochs` epochs of `--steps` steps. Each setup's fit runs right next to its
reference's (the order alternating between rounds), so a shared machine's drift hits both
alike; the ratio of each pair is taken, then the median over `--rounds` rounds:

- each kmp callback at its defaults against a plain fit (no callback): `ModelCheckpoint`
  (a `.keras` file each epoch), `EarlyStopping` (`monitor="loss"`: no validation here),
  `BackupAndRestore` (with its default `stop_signals`), `DeviceMetricsLogger`,
  `WeightSyncVerifier`, `StallWatchdog`; then all of them together;
- the stop-signal watch: `BackupAndRestore()` against `BackupAndRestore(stop_signals=None)`.

The goal is per step (issue 40: <= 1% of a step, a ratio >= 0.99): the time a setup spends
in its callbacks' epoch-level hooks (train and epoch begin and end: the saves and checks, once
per epoch whatever its length) is taken off its fit's time, and reported apart, in ms per
epoch; batch hooks, background threads and collectives count. The launcher's own
`StallWatchdog` is off (`stall_timeout=None`), so the plain fit has no callback at all.

    python benchmarks/callbacks_overhead.py [--quick] [--rounds 5] [--steps 64] [--epochs 2]
        [--json PATH]
    KERAS_BACKEND=jax python benchmarks/callbacks_overhead.py
    KERAS_BACKEND=torch python benchmarks/callbacks_overhead.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from _suite import CALLBACK, Report, add_arguments, median_ratio
from workers_vs_loop import BATCH, FEATURES, _data, _layers

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

#: Each comparison: (key, subject setup, reference setup).
PAIRS = (("ModelCheckpoint", "ModelCheckpoint", "plain"),
         ("EarlyStopping", "EarlyStopping", "plain"),
         ("BackupAndRestore", "BackupAndRestore", "plain"),
         ("DeviceMetricsLogger", "DeviceMetricsLogger", "plain"),
         ("WeightSyncVerifier", "WeightSyncVerifier", "plain"),
         ("StallWatchdog", "StallWatchdog", "plain"),
         ("all", "all", "plain"),
         ("stop_signals", "BackupAndRestore", "BackupAndRestore(stop_signals=None)"),
         ("plain_again", "plain", "plain"))
#: Hooks called once per step or more: their time stays in the per-step figure.
BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def setups(folder: str) -> dict:
    """Setup name -> factory of the callback list of one fit (fresh callbacks each time)."""
    import keras_mgpu_plugins as kmp

    cb = kmp.callbacks
    count = iter(range(10**6))
    every = {
        "ModelCheckpoint": lambda: cb.ModelCheckpoint(os.path.join(folder, "model.keras")),
        "EarlyStopping": lambda: cb.EarlyStopping(monitor="loss", patience=10**6),
        "BackupAndRestore": lambda: cb.BackupAndRestore(os.path.join(folder, f"b{next(count)}")),
        "DeviceMetricsLogger": lambda: cb.DeviceMetricsLogger(),
        "WeightSyncVerifier": lambda: cb.WeightSyncVerifier(),
        "StallWatchdog": lambda: cb.StallWatchdog(),
    }
    found = {"plain": list, **{name: (lambda make=make: [make()]) for name, make in every.items()}}
    found["all"] = lambda: [make() for make in every.values()]
    found["BackupAndRestore(stop_signals=None)"] = lambda: [cb.BackupAndRestore(
        os.path.join(folder, f"b{next(count)}"), stop_signals=None)]
    return found


def _timed(callbacks: list, spent: list[float]) -> list:
    """Wraps each epoch-level hook a callback overrides; their time adds up in `spent[0]`."""
    import keras

    for callback in callbacks:
        for name in dir(keras.callbacks.Callback):
            hook = getattr(callback, name)
            if (not name.startswith("on_") or name in BATCH_HOOKS
                    or getattr(hook, "__func__", None) is getattr(keras.callbacks.Callback, name)):
                continue

            def timed(*args, _hook=hook, **kwargs):
                start = time.perf_counter()
                try:
                    return _hook(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - start

            setattr(callback, name, timed)
    return callbacks


def job(steps: int, epochs: int, rounds: int, width: int, folder: str,
        pairs: tuple = PAIRS, warmup: tuple[str, ...] = ("all", "plain")) -> dict:
    """One worker: every pair of `pairs` each round, alternating, after a fit of each
    `warmup` setup; the chief's times (also run in one process: the GPU run's
    `stop_signals` part)."""
    import contextlib
    import io

    import keras

    import keras_mgpu_plugins as kmp

    @kmp.parallelize
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(_layers(width))
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model = build()
    x, y = _data(BATCH, steps)
    made = setups(folder)

    def fit(setup: str) -> tuple[float, float]:
        spent = [0.0]
        callbacks = _timed(made[setup](), spent)
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # DeviceMetricsLogger's summary table
            model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                      callbacks=callbacks)
        # JAX returns from a fit without callbacks with its last steps still queued: the
        # next fit would pay for them (plain against plain read 1.5x). Wait for the weights.
        keras.ops.convert_to_numpy(model.trainable_variables[-1])
        return time.perf_counter() - start, spent[0]

    for setup in warmup:  # traces, compiles, and every callback's first-time work
        fit(setup)
    times: dict[str, dict[str, list]] = {key: {"subject": [], "reference": [], "hooks": [],
                                               "reference_hooks": []} for key, _, _ in pairs}
    for r in range(rounds):
        for key, subject, reference in pairs:
            order = ((reference, "reference"), (subject, "subject"))
            for setup, side in order if r % 2 == 0 else order[::-1]:
                wall, hooks = fit(setup)
                times[key][side].append(wall - hooks)
                times[key]["hooks" if side == "subject" else "reference_hooks"].append(hooks)
    return {"times": times, "worker": kmp.topology().worker_index,
            "replicas": int(kmp.runtime.of(model).replicas_in_sync)}


def measure(steps: int = 64, epochs: int = 2, rounds: int = 5, width: int = 256,
            timeout: float = 3600) -> dict:
    """Runs the job on 2 workers. Returns `{key: {"ratio", "ratios", "hooks_ms_per_epoch",
    "step_ms"}}` and `"replicas"` (see the module docstring)."""
    import keras_mgpu_plugins as kmp

    env = {"KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "tensorflow")}
    if env["KERAS_BACKEND"] == "torch":
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")  # as torch_vs_ddp.py
    with tempfile.TemporaryDirectory(prefix="kmp-callbacks-") as folder:
        results = kmp.launch(job, num_workers=2, args=(steps, epochs, rounds, width, folder),
                             timeout=timeout, create_strategy=False, stall_timeout=None, env=env)
    chief = next(r for r in results if r["worker"] == 0)
    return {"replicas": chief["replicas"], **summarize(chief["times"], steps, epochs)}


def summarize(times: dict, steps: int, epochs: int) -> dict:
    """`job`'s times as `{key: {"ratio", "ratios", "hooks_ms_per_epoch", "step_ms",
    "reference_step_ms"}}` (the ratio: speed per step, subject / reference)."""
    found: dict = {}
    for key, t in times.items():
        ratio, ratios = median_ratio(t["reference"], t["subject"])  # speed: subject / reference
        found[key] = {"ratio": ratio, "ratios": ratios,
                      "hooks_ms_per_epoch": 1e3 * statistics.median(t["hooks"]) / epochs,
                      "step_ms": 1e3 * statistics.median(t["subject"]) / (steps * epochs),
                      "reference_step_ms": 1e3 * statistics.median(t["reference"]) / (steps * epochs)}
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=5)
    parser.add_argument("--steps", type=int, default=64, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per fit")
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args(argv)
    steps, epochs, rounds, width = ((4, 2, 1, 32) if args.quick else
                                    (args.steps, args.epochs, args.rounds, args.width))
    import keras

    backend = keras.backend.backend()
    r = measure(steps, epochs, rounds, width)
    report = Report("callbacks_overhead", f"kmp's callbacks against a plain fit, {backend}, "
                    "2 workers", args.quick)
    how = (f"2 workers of kmp.launch ({r['replicas']} replicas), MLP {FEATURES}-{width}-{width}"
           f"-10, Adam, global batch {BATCH}, fits of {epochs} epochs x {steps} steps, each "
           f"next to its reference's, median of {rounds} rounds")
    for key, _, _ in PAIRS:
        f = r[key]
        name = {"all": "all six callbacks together / plain fit",
                "stop_signals": "BackupAndRestore() / BackupAndRestore(stop_signals=None): the "
                                "stop-signal watch",
                "plain_again": "plain fit / plain fit (the noise of the machine)"}.get(
            key, f"{key}() / plain fit")
        report.ratio(key, f"{backend}: {name}, speed per step", f["ratio"],
                     None if key == "plain_again" else CALLBACK, f["ratios"],
                     f"{how}; {f['step_ms']:.2f} ms a step against {f['reference_step_ms']:.2f}; "
                     f"epoch-level hooks {f['hooks_ms_per_epoch']:.1f} ms per epoch, not counted")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
