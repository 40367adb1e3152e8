"""What `DeviceMetricsLogger`'s FLOPs, MFU and step phases cost at its defaults, side by side.

Trains one model for `--steps` batches per `fit`, `--repeats` times in each setup,
interleaved (A B, B A, ...) so drifts of a shared machine hit both alike:

- `none`: no callback;
- `logger`: `DeviceMetricsLogger()` at its defaults: batch-start clock reads (now with the
  phase totals copied), the train function wrapped (two clock reads per step), the FLOP count
  once per compiled step function, the CPU's peak measured once per process, one record per
  epoch with the efficiency keys, the summary.

Prints the median wall and CPU time per step of each and their ratio, then the parts of the
logger's new cost, each measured on its own: the wrapper around the step, the input clock
around a batch read, the batch-start hook, the FLOP count (once per train function) and the
CPU peak (once per process), and their sum for one `--steps`-step epoch as a share of it.

    python benchmarks/device_metrics_mfu_overhead.py [--steps 100] [--repeats 9] [--units 512]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build(units: int, features: int):
    import keras

    model = keras.Sequential([keras.Input((features,)),
                              keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(units, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="batches per fit")
    parser.add_argument("--repeats", type=int, default=9, help="fits per setup")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--units", type=int, default=512)
    args = parser.parse_args()

    import keras
    import numpy as np

    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger

    features = 64
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch * args.steps, features)).astype("float32")
    y = rng.normal(size=(len(x), 1)).astype("float32")
    model = build(args.units, features)
    setups = {"none": list, "logger": lambda: [DeviceMetricsLogger()]}

    def fit_seconds(callbacks) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(io.StringIO()):  # the logger's summary
            model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                      callbacks=callbacks)
        return time.perf_counter() - wall, time.process_time() - cpu

    fit_seconds([])  # traces the train function once, for both
    fit_seconds([DeviceMetricsLogger(summary=False)])  # the count and the CPU peak, once
    wall: dict[str, list[float]] = {name: [] for name in setups}
    cpu: dict[str, list[float]] = {name: [] for name in setups}
    names = list(setups)
    for r in range(args.repeats):
        for name in names[r % 2:] + names[: r % 2]:
            w, c = fit_seconds(setups[name]())
            wall[name].append(w / args.steps)
            cpu[name].append(c / args.steps)

    base, base_cpu = statistics.median(wall["none"]), statistics.median(cpu["none"])
    print(f"DeviceMetricsLogger (FLOPs, MFU, phases) overhead: {args.steps} steps x "
          f"{args.repeats} fits per setup, batch {args.batch}, Dense {args.units}x2, backend "
          f"{keras.backend.backend()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}")
    print("  setup     wall ms/step  ratio    CPU ms/step  ratio   (medians)")
    for name in names:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"  {name:<8} {1000 * w:12.3f}  {w / base:6.4f} {1000 * c:12.3f}  {c / base_cpu:6.4f}")
    parts(args.steps, base, model, x[: args.batch], y[: args.batch])


def parts(steps: int, step_s: float, model, x, y) -> None:
    """Each new part of the logger's cost, on its own (medians)."""
    import types

    from keras_mgpu_plugins import _backend, _step_phases
    from keras_mgpu_plugins.compat._step_watch import Watch
    from keras_mgpu_plugins.samplers import peaks
    from keras_mgpu_plugins.samplers import records as rec

    calls = 100_000
    stub = types.SimpleNamespace(train_function=lambda *a: None)
    watch = Watch(stub, count=False)
    plain = statistics.median(_timed(lambda: [stub.train_function() for _ in range(calls)])
                              for _ in range(5))
    watch.undo()
    bare = statistics.median(_timed(lambda: [(lambda *a: None)() for _ in range(calls)])
                             for _ in range(5))
    wrapper = (plain - bare) / calls
    clock = _step_phases.PhaseClock()
    clock.watch()
    reading = statistics.median(_timed(lambda: [_read(clock) for _ in range(calls)])
                                for _ in range(5)) / calls
    timer = rec.StepTimer(counters=clock.totals)
    timer.start_run()
    marks = statistics.median(_timed(lambda: [timer.mark(i) for i in range(calls)])
                              for _ in range(5)) / calls

    model.train_on_batch(x, y)  # the train function exists
    backend = _backend.active()
    counted = []
    for _ in range(3):
        start = time.perf_counter()
        if keras_backend() == "tensorflow":
            import tensorflow as tf

            from keras_mgpu_plugins.backends.tensorflow.flops import count

            count(model, (tf.TensorSpec(x.shape, x.dtype), tf.TensorSpec(y.shape, y.dtype)))
        elif keras_backend() == "jax":
            import jax

            from keras_mgpu_plugins.backends.jax.flops import count

            count(model, (jax.ShapeDtypeStruct(x.shape, x.dtype),))
        else:
            backend.count_step_flops(model, lambda *a: model.train_on_batch(x, y), ([(x, y)],))
        counted.append(time.perf_counter() - start)
    peaks._cpu.clear()
    peak = _timed(peaks.cpu_peak_tflops)
    per_step = wrapper + reading + marks
    print(f"  step wrapper       {1e6 * wrapper:8.3f} us   per step")
    print(f"  input clock        {1e6 * reading:8.3f} us   per batch read by kmp's feeding")
    print(f"  batch-start mark   {1e6 * marks:8.3f} us   per step (the clock read and the copy)")
    print(f"  FLOP count         {1e3 * statistics.median(counted):8.1f} ms   once per compiled "
          f"step function")
    print(f"  CPU peak           {1e3 * peak:8.1f} ms   once per process, on a CPU")
    print(f"  per-step parts: {per_step / step_s:.2e} of a {1e3 * step_s:.2f} ms step")
    once = statistics.median(counted) + peak
    print(f"  with the one-time parts, over one {steps}-step fit: "
          f"{(per_step * steps + once) / (step_s * steps):.2e}; over 10 such epochs: "
          f"{(per_step * steps * 10 + once) / (step_s * steps * 10):.2e}")


def keras_backend() -> str:
    import keras

    return keras.backend.backend()


def _read(clock) -> None:
    with clock.reading_input():
        pass


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
