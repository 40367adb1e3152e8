"""Parameter servers against all-reduce on the same workers, and asynchronous convergence.

Throughput: the same model and per-step batch trained by `kmp.launch` in four jobs on
localhost: all-reduce (`MultiWorkerMirroredStrategy`; 1 worker is one process) with 1
and 2 workers, and parameter servers (`strategy="parameter_server"`, one parameter
server, the chief coordinating) with 1 and 2 workers. In each job, after a warm-up fit
(tracing), one fit of `--steps` steps is timed on the chief: steps per second, and
samples per second (all-reduce splits each global batch over the workers; under
parameter servers each step is one worker's whole batch). On one machine every process
shares its cores: this measures what each synchronisation costs, not a speed-up.

Convergence: the tests' model (tests/multi_worker/test_parameter_server.py: 4 inputs,
8 hidden units, SGD 0.05, batch 16) trained for `--epochs` on 320 rows, for each of
`--seeds` seeds, on one device and with parameter servers and 2 workers (asynchronous);
the final losses and their ratio per seed.

    python benchmarks/parameter_server.py [--steps 300] [--seeds 3] [--epochs 10] [--quick]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _suite import Report, add_arguments

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FEATURES, WIDTH, BATCH = 64, 256, 256


def throughput_job(strategy: str, steps: int) -> dict:
    """The chief's steps/s and samples/s for one fit of `steps` steps after a warm-up."""
    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp

    @kmp.parallelize(strategy=strategy)
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(WIDTH, activation="relu"),
                                  keras.layers.Dense(WIDTH, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model = build()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * steps, FEATURES)).astype("float32")
    y = rng.integers(0, 10, size=(BATCH * steps,))
    model.fit(x[: BATCH * 20], y[: BATCH * 20], batch_size=BATCH, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    seconds = time.perf_counter() - start
    return {"steps_per_s": steps / seconds, "samples_per_s": steps * BATCH / seconds,
            "seconds": seconds}


def convergence_job(strategy: str | None, seeds: list[int], epochs: int) -> list[float]:
    """The final training loss of the tests' model for each seed."""
    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp

    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
    losses = []
    for seed in seeds:
        def build(seed: int = seed) -> keras.Model:
            keras.utils.set_random_seed(seed)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
            return model

        model = (kmp.parallelize(strategy=strategy)(build) if strategy else build)()
        keras.utils.set_random_seed(seed)  # the order of the rows
        history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0)
        losses.append(history.history["loss"][-1])
    return losses


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    add_arguments(parser, rounds=None)  # --quick: the 2-worker jobs, no convergence job
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.epochs = 24, 1, 1
    import keras_mgpu_plugins as kmp

    results = {}
    jobs = [("all-reduce, 1 worker", "auto", 1, 0), ("all-reduce, 2 workers", "auto", 2, 0),
            ("parameter servers, 1 worker", "parameter_server", 1, 1),
            ("parameter servers, 2 workers", "parameter_server", 2, 1)]
    for name, strategy, workers, num_ps in jobs[1::2] if args.quick else jobs:  # --quick: 2
        out = kmp.launch(throughput_job, num_workers=workers, num_ps=num_ps,
                         args=(strategy, args.steps), timeout=1800)[0]
        results[name] = out
        print(f"{name}: {out['steps_per_s']:.1f} steps/s, {out['samples_per_s']:,.0f} samples/s",
              flush=True)
    seeds = list(range(args.seeds))
    one = convergence_job(None, seeds, args.epochs)
    ps = one if args.quick else kmp.launch(  # --quick: no second parameter-server job
        convergence_job, num_workers=2, num_ps=1, args=("parameter_server", seeds, args.epochs),
        timeout=1800)[0]
    ratios = [p / o for p, o in zip(ps, one, strict=True)]
    results["convergence"] = {"one_device": one, "parameter_servers_2_workers": ps,
                              "ratios": ratios}
    for seed, o, p, r in zip(seeds, one, ps, ratios, strict=True):
        print(f"seed {seed}: final loss one device {o:.4f}, parameter servers (2 workers, "
              f"asynchronous) {p:.4f}: {r:.2f}x", flush=True)
    print(f"largest ratio {max(ratios):.2f}x, median {statistics.median(ratios):.2f}x")
    report = Report("parameter_server", "TensorFlow: parameter servers against all-reduce on the "
                    "same workers", args.quick)
    for workers in ("2 workers",) if args.quick else ("1 worker", "2 workers"):
        ps, ar = results[f"parameter servers, {workers}"], results[f"all-reduce, {workers}"]
        report.ratio(f"ps_{workers.replace(' ', '_')}",
                     f"parameter servers (1 ps) / all-reduce, {workers}, steps/s",
                     ps["steps_per_s"] / ar["steps_per_s"], None, [],
                     f"kmp.launch on one machine, MLP {FEATURES}-{WIDTH}-{WIDTH}-10, Adam, "
                     f"{BATCH} rows a step, one timed fit of {args.steps} steps after a warm-up")
    report.ratio("convergence", "final loss, parameter servers with 2 asynchronous workers / "
                 "one device (median over seeds)", statistics.median(ratios), None, ratios,
                 f"the tests' model, SGD 0.05, batch 16, {args.epochs} epochs of 320 rows, "
                 f"seeds 0-{args.seeds - 1}")
    for name, out in results.items():
        if name != "convergence":
            report.row(name, out["steps_per_s"], "steps/s", f"{out['samples_per_s']:,.0f} samples/s")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
