"""What `kmp.callbacks.WeightSyncVerifier` costs: fingerprint throughput, and overhead on fit.

1. Throughput. One graph call fingerprints every variable of a model
   (`--mb` MB of float32 weights in `--layers` Dense layers plus biases) on the
   device that holds it, against one graph call of `tf.reduce_sum` over the
   same variables: the memory-bandwidth yardstick, since both read every byte
   once. Medians of `--repeats` calls each, interleaved. Target: >= 50%.
2. Overhead at the defaults (a check at train begin and at every epoch end)
   against a plain `fit` of the same model: `--repeats` fits of each, with
   `--epochs` epochs of `--steps` steps, interleaved (plain, verifier,
   verifier, plain, ...) so drifts of a shared machine hit both alike. Prints
   the ratio of median wall times and, measured directly, the median time the
   verifier's hooks took as a share of the fit (the first fit, which compiles
   the fingerprint kernels, is reported apart). Target: <= 1%.

Ratios are measured in this one run. With `--devices N` (before TensorFlow
starts) the device is split into N logical devices and the model is mirrored
over them, as in the tests.

    python benchmarks/weight_sync_fingerprint.py [--quick] [--mb 64] [--repeats 7] [--devices 2]
        [--json PATH]

With one replica on one worker there is nothing to compare and a check costs
nothing, so the overhead part mirrors the model over 2 logical devices by default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _suite import CALLBACK, Report, add_arguments, median_ratio

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64.0, help="MB of weights (throughput part)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50, help="steps per epoch (overhead part)")
    parser.add_argument("--units", type=int, default=512, help="width of the fitted model")
    parser.add_argument("--devices", type=int, default=2,
                        help="split the device into N logical ones (0: use the real devices)")
    add_arguments(parser, rounds=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.mb, args.layers, args.repeats, args.epochs, args.steps, args.units = 1, 2, 2, 1, 4, 32
    return args


def throughput(args: argparse.Namespace) -> dict:
    """Prints the throughput lines and returns them as numbers.

    Returns:
        `{"gb_per_s": {"fingerprint": ..., "tf.reduce_sum": ...}, "ratio": fingerprint / reduce_sum,
        "bytes": ..., "variables": ..., "repeats": ...}`, the ratio from the medians.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow import fingerprint

    width = int((args.mb * 2**20 / 4 / args.layers) ** 0.5)
    model = keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(width) for _ in range(args.layers)])
    variables = [v.value for v in model.variables]
    nbytes = sum(int(np.prod(v.shape)) * v.dtype.size for v in variables)

    fingerprints = fingerprint.make_fingerprinter([variables])

    @tf.function(autograph=False)
    def sums():
        out = []
        for v in variables:
            with tf.device(v.device):
                out.append(tf.reduce_sum(v))
        return tf.stack(out)

    def run_sums():
        return sums().numpy()

    timings: dict[str, list[float]] = {"tf.reduce_sum": [], "fingerprint": []}
    calls = {"tf.reduce_sum": run_sums, "fingerprint": fingerprints}
    for fn in calls.values():  # trace and compile
        fn()
    for _ in range(args.repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - start)
    print(f"1. Throughput over {len(variables)} variables, {nbytes / 2**20:.1f} MiB "
          f"on {variables[0].device} (median of {args.repeats}):")
    medians = {name: statistics.median(t) for name, t in timings.items()}
    rates = {name: nbytes / median / 1e9 for name, median in medians.items()}
    ratio = medians["tf.reduce_sum"] / medians["fingerprint"]
    for name, median in medians.items():
        print(f"   {name:14s} {rates[name]:7.2f} GB/s  ({median * 1e3:.2f} ms)")
    print(f"   fingerprint / reduce_sum throughput: {ratio:.2f}  (target >= 0.50)")
    return {"gb_per_s": rates, "ratio": ratio, "bytes": nbytes, "variables": len(variables),
            "repeats": args.repeats}


def overhead(args: argparse.Namespace) -> dict:
    import logging

    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks.weight_sync_verifier import WeightSyncVerifier

    logging.getLogger("keras_mgpu_plugins").setLevel(logging.ERROR)  # BN statistics reports

    class Timed(WeightSyncVerifier):
        spent = 0.0

        def _check(self, *a, **k):
            start = time.perf_counter()
            try:
                super()._check(*a, **k)
            finally:
                Timed.spent += time.perf_counter() - start

    @kmp.parallelize
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(args.units, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(args.units, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model = build()
    batch = 64 * model.distribute_strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * args.steps, 64)).astype("float32")
    y = rng.integers(0, 10, size=(batch * args.steps,))

    def fit(callbacks):
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=args.epochs, verbose=0, callbacks=callbacks)
        return time.perf_counter() - start

    fit([])  # trace the train step
    Timed.spent = 0.0
    first = fit([Timed()])
    first_spent = Timed.spent
    wall = {"plain": [], "verifier": []}
    share = []
    for i in range(args.repeats):
        for name in (("plain", "verifier") if i % 2 == 0 else ("verifier", "plain")):
            Timed.spent = 0.0
            seconds = fit([Timed()] if name == "verifier" else [])
            wall[name].append(seconds)
            if name == "verifier":
                share.append(Timed.spent / seconds)
    plain, verified = statistics.median(wall["plain"]), statistics.median(wall["verifier"])
    checks = 1 + args.epochs
    print(f"2. Overhead at the defaults: {model.count_params():,} parameters on "
          f"{model.distribute_strategy.num_replicas_in_sync} replica(s), {args.epochs} epochs x "
          f"{args.steps} steps, {checks} checks per fit (median of {args.repeats}):")
    print(f"   plain fit {plain:.3f} s, with verifier {verified:.3f} s: "
          f"ratio {verified / plain:.4f}  (target <= 1.01)")
    print(f"   verifier hooks: {statistics.median(share) * 100:.3f}% of the fit, "
          f"{statistics.median(share) * verified / checks * 1e3:.2f} ms per check  (target <= 1%)")
    print(f"   first fit with a verifier (compiles the kernels): hooks took {first_spent:.2f} s "
          f"of {first:.2f} s")
    ratio, ratios = median_ratio(wall["plain"], wall["verifier"])
    return {"ratio": ratio, "ratios": ratios, "share": statistics.median(share), "checks": checks,
            "replicas": int(model.distribute_strategy.num_replicas_in_sync),
            "ms_per_check": statistics.median(share) * verified / checks * 1e3}


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.devices:
        import keras_mgpu_plugins as kmp

        kmp.simulate_devices(args.devices)
    t = throughput(args)
    o = overhead(args)
    report = Report("weight_sync_fingerprint", "WeightSyncVerifier: fingerprint throughput and "
                    "its cost in fit, TensorFlow", args.quick)
    report.ratio("throughput", f"fingerprint / tf.reduce_sum, GB/s ({args.mb:g} MB of float32 "
                 "weights)", t["ratio"], (">=", 0.5), [],
                 f"one graph call each over {t['variables']} variables, median of "
                 f"{t['repeats']} calls, interleaved")
    report.ratio("overhead", "fit with WeightSyncVerifier() / plain fit, speed (its checks "
                 "included)", o["ratio"], CALLBACK, o["ratios"],
                 f"{o['replicas']} replicas, {args.epochs} epochs x {args.steps} steps, "
                 f"{o['checks']} checks per fit, {o['ms_per_check']:.2f} ms per check, "
                 f"{args.repeats} alternating pairs of fits")
    for name, rate in t["gb_per_s"].items():
        report.row(name, rate, "GB/s")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
