"""What `kmp.callbacks.StallWatchdog` costs per step, against the same fit without it.

Trains one small model for `--steps` batches per `fit`, `--repeats` times with and
without `StallWatchdog(timeout=600)` (and with a callback whose batch-end hook
does nothing: the cost of any batch hook), interleaved so drifts of a shared machine
hit both alike, and prints the median wall time per step of each, their ratio,
and the cost of the watchdog's batch hook alone (two assignments, measured with
`timeit`). Its thread wakes once a second, off the training thread.

    python benchmarks/stall_watchdog_overhead.py [--quick] [--steps 200] [--repeats 9] [--units 256]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import timeit

from _suite import CALLBACK, Report, add_arguments, median_ratio

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=None)
    parser.add_argument("--steps", type=int, default=200, help="batches per fit")
    parser.add_argument("--repeats", type=int, default=9, help="fits per setup")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--units", type=int, default=256)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.units = 8, 3, 16

    import keras
    import numpy as np

    from keras_mgpu_plugins.callbacks.stall_watchdog import StallWatchdog, note_progress

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch * args.steps, 32)).astype("float32")
    y = rng.normal(size=(len(x), 1)).astype("float32")
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(args.units, "relu"),
                              keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0)  # trace before timing
    folder = tempfile.mkdtemp(prefix="kmp-stall-bench-")
    class BatchEndNoOp(keras.callbacks.Callback):  # what any batch-end hook costs
        def on_train_batch_end(self, batch, logs=None):
            pass

    setups = {"none": lambda: [], "noop_hook": lambda: [BatchEndNoOp()],
              "watchdog": lambda: [StallWatchdog(timeout=600, directory=folder)]}
    per_step: dict[str, list[float]] = {name: [] for name in setups}
    for repeat in range(args.repeats):
        names = list(setups)
        for name in names[repeat % 3:] + names[:repeat % 3]:
            start = time.perf_counter()
            model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                      callbacks=setups[name]())
            per_step[name].append((time.perf_counter() - start) / args.steps)
    medians = {name: statistics.median(times) for name, times in per_step.items()}
    hook = min(timeit.repeat(note_progress, number=100_000, repeat=5)) / 100_000
    print(f"steps per fit: {args.steps}, fits per setup: {args.repeats}, "
          f"batch {args.batch}, Dense({args.units})")
    for name, median in medians.items():
        print(f"{name:>9}: {median * 1e3:.3f} ms/step (median)")
    print(f"ratio watchdog/none: {medians['watchdog'] / medians['none']:.3f}, "
          f"noop_hook/none: {medians['noop_hook'] / medians['none']:.3f}, "
          f"watchdog/noop_hook: {medians['watchdog'] / medians['noop_hook']:.3f}")
    print(f"batch hook alone: {hook * 1e9:.0f} ns "
          f"({hook / medians['none'] * 100:.4f}% of a step)")
    report = Report("stall_watchdog_overhead", "StallWatchdog at its defaults against a plain "
                    "fit, one device", args.quick)
    ratio, ratios = median_ratio(per_step["none"], per_step["watchdog"])
    report.ratio("watchdog", f"fit with StallWatchdog(timeout=600) / plain fit, speed per step "
                 f"({keras.backend.backend()})", ratio, CALLBACK, ratios,
                 f"one device, Dense({args.units}), batch {args.batch}, {args.steps}-step fits, "
                 f"{args.repeats} fits per setup in rotating order; its batch hook alone "
                 f"{hook * 1e9:.0f} ns")
    report.ratio("noop_hook", "fit with a batch-end hook doing nothing / plain fit (what any "
                 "batch hook costs)", *median_ratio(per_step["none"], per_step["noop_hook"])[:1],
                 None, median_ratio(per_step["none"], per_step["noop_hook"])[1])
    for name, median in medians.items():
        report.row(f"{name}, wall time a step", median * 1e3, "ms")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
