"""kmp on JAX against plain Keras-JAX `DataParallel`, and JAX against TensorFlow (kmp on both).

Every job is a fresh process (or 2) started by `kmp.launch(..., create_strategy=False)`
with `KERAS_BACKEND` set for it, so the parent may run either backend. Same model
as `workers_throughput.py` (an MLP of two hidden layers, `--width` units), Adam, global
batch 256, the same generated arrays, `shuffle=False` on both sides:

- devices: one process, 2 simulated CPU devices. kmp: `kmp.simulate_devices(2)`, then
  `@kmp.parallelize` and `fit(x, y, batch_size=256)`. Plain: `jax_num_cpu_devices=2`,
  `keras.distribution.set_distribution(DataParallel(devices=list_devices()))` by hand.
  On both sides a callback reads the loss after each execution (see `_timed`).
- processes: 2 processes of one CPU device each. kmp: `@kmp.parallelize` (which joins
  `jax.distributed`) and `fit` on the global arrays. Plain: `keras.distribution.initialize`
  with the coordinator `kmp.launch` planned (worker 0's address), `DataParallel(
  auto_shard_dataset=False)` over `jax.devices()`, and each process passing its own share
  of every global batch by hand (rows `[p*128, (p+1)*128)` of each 256, cut before timing)
  with `batch_size=128`.
- JAX vs TensorFlow: the kmp side of "processes" on JAX and on TensorFlow (2 workers of a
  `MultiWorkerMirroredStrategy`, which `@kmp.parallelize` creates): needs both installed.

In a job, after a warm-up fit (tracing), `--repeats` fits of `--steps` steps are timed
each from the call to its return (what kmp adds around `fit`, e.g. cutting each process's
rows, counts); a job's throughput is the chief's median of global samples per second. The
two sides alternate for `--rounds` rounds (kmp first in even rounds, second in odd ones);
each round gives a ratio, and the median ratio is reported with every round's, for each
`--steps-per-execution` (default 16 and 1).

    python benchmarks/jax_vs_keras.py [--quick] [--rounds 5] [--repeats 3] [--steps 160]
        [--steps-per-execution 16 1] [--only devices processes backends] [--json PATH]

Each job trains one model per `steps_per_execution`, in turn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _suite import PLAIN, Report, add_arguments, median_ratio
from workers_vs_loop import BATCH, FEATURES, _data, _layers  # the same MLP and data

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

WIDTH = 512


def _model(width: int, steps_per_execution: int):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(_layers(width))  # the TensorFlow benchmarks' MLP
    model.compile(optimizer="adam", steps_per_execution=steps_per_execution,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _timed(model, x, y, batch: int, global_samples: int, repeats: int,
           read_loss: bool = False) -> float:
    """Global samples/s of `repeats` fits (their median), after one warm-up fit.

    With `read_loss`, a callback reads the loss after every execution (as a progress
    bar does), which waits for it: on one process of 2 simulated CPU devices on 2 cores,
    Keras-JAX's 160-step fit left to run ahead aborts (XLA's 40 s rendezvous timeout
    of an all-reduce), plain Keras as kmp.
    """
    import keras

    class ReadLoss(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])

    callbacks = [ReadLoss()] if read_loss else []
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        rates.append(global_samples / (time.perf_counter() - start))
    return statistics.median(rates)


def kmp_job(steps: int, repeats: int, batch: int, width: int, executions: list[int],
            simulate: int = 0) -> dict:
    """kmp's side (either backend): `@kmp.parallelize` and `fit` on the global arrays, a
    model per `steps_per_execution` of `executions`."""
    import keras_mgpu_plugins as kmp

    if simulate:
        kmp.simulate_devices(simulate)
    x, y = _data(batch, steps)
    rates = {}
    for n in executions:
        model = kmp.parallelize(_model)(width, n)  # JAX: joins jax.distributed; TF: MWMS
        rates[n] = _timed(model, x, y, batch, batch * steps, repeats, read_loss=bool(simulate))
    return _result(rates, int(kmp.runtime.of(model).replicas_in_sync))


def plain_job(steps: int, repeats: int, batch: int, width: int, executions: list[int],
              simulate: int = 0) -> dict:
    """Plain Keras-JAX's side: `keras.distribution.DataParallel` set up by hand."""
    import jax

    if simulate:
        jax.config.update("jax_num_cpu_devices", simulate)
    from keras_mgpu_plugins.cluster.processes import planned_processes

    plan = planned_processes()  # the coordinator kmp.launch planned (worker 0's address)
    import keras

    if plan is not None:
        keras.distribution.initialize(plan.coordinator_address, plan.num_processes,
                                      plan.process_id)
    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices(),
                                                   auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    x, y = _data(batch, steps)
    processes, index = jax.process_count(), jax.process_index()
    share = batch // processes  # this process's rows of every global batch, cut by hand
    x = x.reshape(steps, processes, share, FEATURES)[:, index].reshape(-1, FEATURES)
    y = y.reshape(steps, processes, share)[:, index].reshape(-1)
    rates = {n: _timed(_model(width, n), x, y, share, batch * steps, repeats,
                       read_loss=bool(simulate)) for n in executions}
    return _result(rates, int(distribution.device_mesh.devices.size))


def _result(rates: dict, devices: int) -> dict:
    import keras_mgpu_plugins as kmp

    return {"rates": rates, "devices": devices, "worker": kmp.topology().worker_index}


#: The sides of each comparison: (name, job, workers, KERAS_BACKEND, simulated devices).
SETUPS = {
    "devices": (("kmp", kmp_job, 1, "jax", 2), ("plain", plain_job, 1, "jax", 2)),
    "processes": (("kmp", kmp_job, 2, "jax", 0), ("plain", plain_job, 2, "jax", 0)),
    "backends": (("jax", kmp_job, 2, "jax", 0), ("tensorflow", kmp_job, 2, "tensorflow", 0)),
}
#: Each comparison's title and goal (JAX vs TensorFlow: reported, no goal).
TITLES = {
    "devices": ("kmp on JAX / plain Keras-JAX DataParallel, 1 process of 2 simulated CPU "
                "devices", PLAIN),
    "processes": ("kmp on JAX / plain Keras-JAX DataParallel, 2 processes", PLAIN),
    "backends": ("JAX / TensorFlow, kmp on both, 2 processes", None),
}


def missing(which: str) -> str | None:
    """Why comparison `which` cannot run here (a backend not installed), or `None`."""
    import importlib.util

    needed = {"jax"} | ({"tensorflow"} if which == "backends" else set())
    absent = sorted(m for m in needed if importlib.util.find_spec(m) is None)
    return f"{' and '.join(absent)} not installed in this environment" if absent else None


def measure(which: str, steps: int = 160, repeats: int = 3, rounds: int = 5,
            executions: tuple[int, ...] = (16, 1), width: int = WIDTH, batch: int = BATCH,
            timeout: float = 600, report=print) -> dict:
    """Alternates the two sides of comparison `which` (a key of `SETUPS`), `rounds` times
    (the first side first in even rounds); each job trains a model per `steps_per_execution`.

    Returns:
        `{"names", "devices", n: {"first", "second", "ratio", "ratios"}}` for each `n` of
        `executions`: the medians over the rounds of each side's samples/s and of the rounds'
        ratios first / second (each in `ratios`); the devices each side trained on.
    """
    import keras_mgpu_plugins as kmp

    for n in executions:
        if steps % n:
            raise ValueError(f"steps must be a multiple of steps_per_execution. Received: "
                             f"steps={steps}, steps_per_execution={n}")
    sides = SETUPS[which]

    def chief(side) -> dict:
        _, job, workers, backend, simulate = side
        results = kmp.launch(job, num_workers=workers, timeout=timeout, create_strategy=False,
                             args=(steps, repeats, batch, width, list(executions), simulate),
                             env={"KERAS_BACKEND": backend})
        return next(r for r in results if r["worker"] == 0)

    found: list[list[dict]] = [[], []]
    for index in range(rounds):
        for i in (0, 1) if index % 2 == 0 else (1, 0):
            found[i].append(chief(sides[i]))
        if report is not None:
            report(f"  round {index + 1}: " + "  ".join(
                f"spe {n}: {sides[0][0]} {found[0][-1]['rates'][n]:7.0f} {sides[1][0]} "
                f"{found[1][-1]['rates'][n]:7.0f} samples/s" for n in executions))
    result: dict = {"names": (sides[0][0], sides[1][0]),
                    "devices": (found[0][-1]["devices"], found[1][-1]["devices"])}
    for n in executions:
        first, second = ([r["rates"][n] for r in side] for side in found)
        ratio, ratios = median_ratio(first, second)
        result[n] = {"first": statistics.median(first), "second": statistics.median(second),
                     "ratio": ratio, "ratios": ratios}
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=5)
    parser.add_argument("--repeats", type=int, default=3, help="timed fits per job")
    parser.add_argument("--steps", type=int, default=160, help="steps per fit")
    parser.add_argument("--steps-per-execution", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--only", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    args = parser.parse_args(argv)
    steps, repeats, rounds, width = ((32, 1, 1, 64) if args.quick else
                                     (args.steps, args.repeats, args.rounds, WIDTH))
    print(f"global batch {BATCH}, {steps} steps x {repeats} timed fits per job, {rounds} "
          f"rounds, {os.cpu_count()} CPU cores", flush=True)
    report = Report("jax_vs_keras", "kmp on JAX against plain Keras-JAX DataParallel",
                    args.quick)
    for which in args.only:
        reason = missing(which)
        if reason:
            report.note(f"{which}: not measured ({reason}).")
            continue
        print(which, flush=True)
        r = measure(which, steps=steps, repeats=repeats, rounds=rounds, width=width,
                    executions=tuple(args.steps_per_execution),
                    report=lambda line: print(line, flush=True))
        title, goal = TITLES[which]
        a, b = r["names"]
        for n in args.steps_per_execution:
            report.ratio(f"{which}_spe{n}", f"{title}, samples/s, steps_per_execution={n}",
                         r[n]["ratio"], goal, r[n]["ratios"],
                         f"MLP {FEATURES}-{width}-{width}-10, Adam, global batch {BATCH}, "
                         f"{steps}-step fits, median of {repeats} timed fits per job, median "
                         f"of {rounds} alternating rounds")
            report.row(f"{which}: {a}, steps_per_execution={n}", r[n]["first"], "samples/s",
                       f"{r['devices'][0]} devices")
            report.row(f"{which}: {b}, steps_per_execution={n}", r[n]["second"], "samples/s",
                       f"{r['devices'][1]} devices")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
