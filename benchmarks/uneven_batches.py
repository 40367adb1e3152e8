"""What weighing each replica's loss by its rows costs per step (`uneven_batches_weighted_by_rows`).

Trains one small MLP on 2 replicas (`--where devices`: 2 logical CPU devices in one
process, MirroredStrategy; `--where workers`: 2 processes by `kmp.launch`,
MultiWorkerMirroredStrategy) with kmp's patches as they are, and with that one patch left
out, alternating which goes first, `--rounds` times. Two inputs: arrays whose every global
batch divides over the replicas (`even`, batch 32: the patch keeps Keras's step, no
collective added) and arrays in batches of 33 (`uneven`: every step sums the replicas' rows,
one scalar all-reduce). After a warm-up fit (tracing), each variant times `--repeats` fits of
`--steps` steps; a fit's step time is the median interval between batch starts (robust to
the bursts of a shared machine). Reports, per input, the median over rounds of the speed
ratio (without's step time / patched's: >= 0.99 is the goal for `even`, where the patch must
cost nothing; `uneven` is reported only) and each variant's median step time
(`benchmarks/_suite.py`).

    python benchmarks/uneven_batches.py [--quick] [--json PATH] [--where devices|workers]
        [--rounds 3] [--repeats 3] [--steps 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _suite import PLAIN, Report, add_arguments  # noqa: E402 - after the log level

PATCH = "uneven_batches_weighted_by_rows"
FEATURES, WIDTH = 64, 256
BATCHES = {"even": 32, "uneven": 33}


def _patches(on: bool) -> None:
    """kmp's workarounds in force, with or without `PATCH` (models built after this)."""
    from keras_mgpu_plugins import compat
    from keras_mgpu_plugins.compat import _registry

    compat.unpatch_keras()
    full = getattr(_patches, "full", None) or _registry.PATCHES
    _patches.full = full
    _registry.PATCHES = full if on else tuple(p for p in full if p.name != PATCH)
    compat.patch_keras()


def _step_times(on: bool, batch: int, steps: int, repeats: int) -> list[float]:
    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp

    _patches(on)

    @kmp.parallelize
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(WIDTH, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    class Clock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.starts: list[float] = []

        def on_train_batch_begin(self, batch, logs=None):
            self.starts.append(time.perf_counter())

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, FEATURES)).astype("float32")
    y = rng.integers(0, 10, size=(batch * steps,))
    model = build()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)  # tracing
    times = []
    for _ in range(repeats):
        clock = Clock()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[clock])
        times.append(float(statistics.median(np.diff(clock.starts))))
    return times


def measure(rounds: int, repeats: int, steps: int) -> dict:
    """Per input: each variant's step time (s) and each round's speed ratio without / patched."""
    out = {}
    for name, batch in BATCHES.items():
        on_times, off_times, ratios = [], [], []
        for r in range(rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {on: statistics.median(_step_times(on, batch, steps, repeats)) for on in order}
            on_times.append(got[True])
            off_times.append(got[False])
            ratios.append(got[False] / got[True])
        out[name] = {"patched_ms": 1e3 * statistics.median(on_times),
                     "without_ms": 1e3 * statistics.median(off_times),
                     "ratio": statistics.median(ratios), "ratios": ratios}
    _patches(True)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--where", choices=("devices", "workers"), default="devices")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args(argv)
    rounds, repeats, steps = (1, 1, 8) if args.quick else (args.rounds, args.repeats, args.steps)
    import keras_mgpu_plugins as kmp

    if args.where == "workers":
        result = kmp.launch(measure, num_workers=2, args=(rounds, repeats, steps),
                            timeout=3000)[0]
    else:
        kmp.simulate_devices(2)
        result = measure(rounds, repeats, steps)
    where = ("2 workers of kmp.launch (MultiWorkerMirroredStrategy)" if args.where == "workers"
             else "2 logical CPU devices, one process (MirroredStrategy)")
    report = Report("uneven_batches", f"{PATCH}: its cost per step, {args.where}", args.quick)
    how = (f"{where}, MLP {FEATURES}-{WIDTH}-10, SGD, fits of {steps} steps, median batch "
           f"interval of {repeats} fits a variant, alternating which goes first, median of "
           f"{rounds} rounds")
    for name, got in result.items():
        what = ("batch 32: every batch divides, Keras's step kept" if name == "even" else
                "batch 33: every step sums the replicas' rows (one scalar all-reduce)")
        report.ratio(name, f"{args.where}, {what}: speed per step with the patch / without",
                     got["ratio"], PLAIN if name == "even" else None, got["ratios"],
                     f"{how}; {got['patched_ms']:.2f} ms a step against {got['without_ms']:.2f}")
        report.row(f"{name}: step with the patch", got["patched_ms"], "ms")
        report.row(f"{name}: step without it", got["without_ms"], "ms")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
