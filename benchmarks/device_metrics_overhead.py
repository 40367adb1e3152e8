"""What `kmp.callbacks.DeviceMetricsLogger` costs at its defaults, against the same fit without it.

Trains one model for `--steps` batches per `fit`, `--repeats` times in each of
three setups, interleaved (A B C, B C A, ...) so drifts of a shared machine
hit all three alike:

- `none`: no callback;
- `logger`: `DeviceMetricsLogger()` at its defaults (batch-start clock reads,
  a sampler thread at 1 s, one record per epoch, the summary table);
- `logger+batch_end`: the same plus a callback overriding `on_train_batch_end`
  with a no-op, the cost of a batch-end hook (Keras dispatches batch-end hooks
  asynchronously only when no callback overrides them, and only on backends
  it deems thread-safe: not TensorFlow, see the printed `async dispatch`).

Prints the median wall time per step of each setup and the ratios against
`none`, measured in this one run, then the costs that make up the logger's
share, each measured on its own: the per-batch hook, one sampler reading
(taken off the training thread, once per `sample_interval`) and one epoch-end
record (once per epoch).

    python benchmarks/device_metrics_overhead.py [--quick] [--steps 200] [--repeats 7] [--units 512]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time

from _suite import CALLBACK, Report, add_arguments, median_ratio

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build(units: int, features: int):
    import keras

    model = keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer="adam", loss="mse")
    return model


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=None)
    parser.add_argument("--steps", type=int, default=100, help="batches per fit")
    parser.add_argument("--repeats", type=int, default=15, help="fits per setup")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--units", type=int, default=512)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.batch, args.units = 8, 3, 32, 32

    import keras
    import numpy as np

    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger

    class BatchEndNoOp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    features = 64
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch * args.steps, features)).astype("float32")
    y = rng.normal(size=(len(x), 1)).astype("float32")
    model = build(args.units, features)
    setups = {
        "none": lambda: [],
        "logger": lambda: [DeviceMetricsLogger()],
        "logger+batch_end": lambda: [DeviceMetricsLogger(), BatchEndNoOp()],
    }

    def fit_seconds(callbacks) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(io.StringIO()):  # the logger's summary table
            model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                      callbacks=callbacks)
        return time.perf_counter() - wall, time.process_time() - cpu

    fit_seconds([])  # traces the train function once, for everyone
    wall: dict[str, list[float]] = {name: [] for name in setups}
    cpu: dict[str, list[float]] = {name: [] for name in setups}
    names = list(setups)
    for r in range(args.repeats):
        for name in names[r % 3:] + names[: r % 3]:
            w, c = fit_seconds(setups[name]())
            wall[name].append(w / args.steps)
            cpu[name].append(c / args.steps)

    base, base_cpu = statistics.median(wall["none"]), statistics.median(cpu["none"])
    print(f"DeviceMetricsLogger overhead: {args.steps} steps x {args.repeats} fits per setup, "
          f"batch {args.batch}, Dense {args.units}x2, backend {keras.backend.backend()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print("  setup               wall ms/step  ratio    CPU ms/step  ratio   (medians)")
    for name in names:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"  {name:<17} {1000 * w:12.3f}  {w / base:6.4f} {1000 * c:12.3f}  {c / base_cpu:6.4f}")

    # The parts of the logger's cost, each timed on its own (medians).
    logger = DeviceMetricsLogger()
    logger.set_model(model)
    logger.set_params({"verbose": 0, "epochs": 1, "steps": args.steps})
    with contextlib.redirect_stdout(io.StringIO()):
        fixed = statistics.median(
            _timed(logger.on_train_begin) + _timed(logger.on_train_end) for _ in range(7)
        )
        logger.on_train_begin()
        logger.on_epoch_begin(0)
        calls = 100_000
        per_batch = statistics.median(
            _timed(lambda: [logger.on_train_batch_begin(i) for i in range(calls)]) / calls
            for _ in range(5)
        )
        reads = [_timed(logger._reader.read) for _ in range(51)]
        ends = []
        for epoch in range(1, 22):
            logger.on_epoch_begin(epoch)
            for i in range(3):
                logger.on_train_batch_begin(i)
            ends.append(_timed(lambda e=epoch: logger.on_epoch_end(e, {})))
        epoch_end = statistics.median(ends)
        logger.on_train_end()
    print(f"  per-batch hook     {1e6 * per_batch:8.3f} us   = {per_batch / base:.2e} of a step")
    print(f"  one reading        {1e6 * statistics.median(reads):8.1f} us   on the sampler thread, "
          f"every {logger.sample_interval:g} s: {statistics.median(reads) / logger.sample_interval:.2e} of a core")
    print(f"  epoch-end record   {1e3 * epoch_end:8.3f} ms   once per epoch "
          f"({epoch_end / (base * args.steps):.2e} of this {args.steps}-step epoch)")
    print(f"  start + end of fit {1e3 * fixed:8.3f} ms   once per fit")
    estimate = (per_batch * args.steps + epoch_end + fixed) / (base * args.steps)
    print(f"  sum of the parts for one {args.steps}-step epoch: {estimate:.2e} of its time "
          f"(ratio {1 + estimate:.4f})")
    dispatch = keras.callbacks.CallbackList([logger], model=model)
    print(f"  async dispatch of batch-end hooks with the logger: {dispatch._async_train} "
          f"(without any callback: {keras.callbacks.CallbackList([], model=model)._async_train})")
    report = Report("device_metrics_overhead", "DeviceMetricsLogger at its defaults against a "
                    "plain fit, one device", args.quick)
    ratio, ratios = median_ratio(wall["none"], wall["logger"])
    report.ratio("logger", f"fit with DeviceMetricsLogger() / plain fit, speed per step "
                 f"({keras.backend.backend()})", ratio, CALLBACK, ratios,
                 f"one device, Dense {args.units}x2, batch {args.batch}, {args.steps}-step fits, "
                 f"{args.repeats} fits per setup in rotating order; the parts: per-batch hook "
                 f"{1e6 * per_batch:.2f} us, epoch-end record {1e3 * epoch_end:.2f} ms")
    for name in names:
        report.row(f"{name}, wall time a step", 1e3 * statistics.median(wall[name]), "ms")
    return report.finish(args.json)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
