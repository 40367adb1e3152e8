"""The parts of `DeviceMetricsLogger`'s cost that its FLOPs, MFU and step phases add, each alone.

The side-by-side figure (a fit with the logger at its defaults against a plain fit, which
includes all of this) is `device_metrics_overhead.py`'s, on every lane. This script times,
on the lane it runs on, what the efficiency keys add to it, each part on its own (medians):

- per step: the wrapper around the train function (two clock reads), the batch-start mark
  (one clock read and the copy of the phase totals) and, per batch read by kmp's feeding,
  the input clock;
- once per compiled step function: the FLOP count (TensorFlow's profiler, XLA's cost
  analysis, torch's `FlopCounterMode` on one step);
- once per process, on a CPU: the peak measured by a matmul.

Its ratio `parts` is a step's speed with the per-step parts added against the plain step
(goal: at most 1% slower); `parts_with_once` (reported, no goal) also spreads the one-time
parts over one `--steps`-step fit, an upper bound for short runs (a job of minutes pays
them once).

    python benchmarks/device_metrics_mfu_overhead.py [--quick] [--steps 100] [--units 512] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _suite import CALLBACK, Report, add_arguments

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build(units: int, features: int):
    import keras

    model = keras.Sequential([keras.Input((features,)),
                              keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=None)
    parser.add_argument("--steps", type=int, default=100, help="batches per fit")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--units", type=int, default=512)
    args = parser.parse_args(argv)
    calls = 100_000
    if args.quick:
        args.steps, args.batch, args.units, calls = 8, 32, 32, 1000

    import keras
    import numpy as np

    features = 64
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, features)).astype("float32")
    y = rng.normal(size=(args.batch, 1)).astype("float32")
    model = build(args.units, features)
    model.train_on_batch(x, y)  # the train function exists, traced
    step_s = statistics.median(_timed(lambda: model.train_on_batch(x, y))
                               for _ in range(max(5, args.steps // 4)))
    part = per_step_parts(calls)
    counted = [_timed(lambda: count_once(model, x, y)) for _ in range(3)]
    from keras_mgpu_plugins.samplers import peaks

    peaks._cpu.clear()
    peak = _timed(peaks.cpu_peak_tflops)
    per_step = sum(part.values())
    once = statistics.median(counted) + peak
    with_once = (per_step * args.steps + once) / (step_s * args.steps)

    backend = keras.backend.backend()
    report = Report("device_metrics_mfu_overhead", "DeviceMetricsLogger's FLOPs, MFU and step "
                    f"phases, their parts alone ({backend})", args.quick)
    report.ratio("parts", f"a step with the efficiency parts / a plain step, speed ({backend})",
                 1.0 / (1.0 + per_step / step_s), CALLBACK, None,
                 f"one device, Dense {args.units}x2, batch {args.batch}: per-step parts "
                 f"{1e6 * per_step:.2f} us on a {1e3 * step_s:.2f} ms step")
    report.ratio("parts_with_once", "the same with the FLOP count and the CPU peak spread over "
                 f"one {args.steps}-step fit ({backend})", 1.0 / (1.0 + with_once), None, None,
                 f"the FLOP count and the CPU peak: {1e3 * once:.0f} ms, once per process")
    report.row("plain step (train_on_batch)", 1e3 * step_s, "ms")
    for name, seconds in part.items():
        report.row(name, 1e6 * seconds, "us a step")
    report.row("FLOP count, once per compiled step function", 1e3 * statistics.median(counted),
               "ms")
    report.row("CPU peak, once per process", 1e3 * peak, "ms")
    return report.finish(args.json)


def per_step_parts(calls: int) -> dict[str, float]:
    """Seconds each per-step part costs (the medians of 5 runs of `calls` calls)."""
    import types

    from keras_mgpu_plugins import _step_phases
    from keras_mgpu_plugins.compat._step_watch import Watch
    from keras_mgpu_plugins.samplers import records as rec

    def median(fn) -> float:
        return statistics.median(_timed(fn) for _ in range(5)) / calls

    stub = types.SimpleNamespace(train_function=lambda *a: None)
    watch = Watch(stub, count=False)
    wrapped = median(lambda: [stub.train_function() for _ in range(calls)])
    watch.undo()
    bare = median(lambda: [(lambda *a: None)() for _ in range(calls)])
    clock = _step_phases.PhaseClock()
    clock.watch()
    timer = rec.StepTimer(counters=clock.totals)
    timer.start_run()
    return {"step wrapper": max(wrapped - bare, 0.0),
            "input clock (per batch kmp reads)": median(lambda: [_read(clock) for _ in range(calls)]),
            "batch-start mark": median(lambda: [timer.mark(i) for i in range(calls)])}


def count_once(model, x, y) -> None:
    """One FLOP count of `model`'s train step, as the logger makes it on this backend."""
    import keras

    from keras_mgpu_plugins import _backend

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        from keras_mgpu_plugins.backends.tensorflow.flops import count

        count(model, (tf.TensorSpec(x.shape, x.dtype), tf.TensorSpec(y.shape, y.dtype)))
    elif keras.backend.backend() == "jax":
        import jax

        from keras_mgpu_plugins.backends.jax.flops import count

        count(model, (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(y.shape, y.dtype)))
    else:
        _backend.active().count_step_flops(model, lambda *a: model.train_on_batch(x, y), ([(x, y)],))


def _read(clock) -> None:
    with clock.reading_input():
        pass


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
