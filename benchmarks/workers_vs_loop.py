"""2-worker `fit` through `@kmp.parallelize` against a hand-written `tf.distribute` loop.

Both sides run as 2 workers started by `kmp.launch(..., create_strategy=False)`, each
worker creating its own `MultiWorkerMirroredStrategy` before any TensorFlow op: the kmp
side through `@kmp.parallelize` (what a user's script does), the loop side with
`tf.distribute.MultiWorkerMirroredStrategy()`. Same model as `workers_throughput.py` (an
MLP of two hidden layers, `--width` units), Adam, global batch 256, the same generated
arrays, no shuffle on either side:

- kmp: `model.fit(x, y, batch_size=256, shuffle=False)` with
  `compile(steps_per_execution=N)`;
- loop: the same Keras layers and `keras.optimizers.Adam` built in `strategy.scope()`, the
  arrays as a `tf.data` dataset repeated and batched to 256 (`drop_remainder=True`: no
  per-step check, by an all-reduce, that every worker has input; `fit` under kmp skips it
  too), distributed with `strategy.experimental_distribute_dataset`, one iterator for the
  whole job (as TensorFlow's multi-worker custom-loop tutorial), and a `tf.function` running N
  `strategy.run` steps (a `tf.while_loop`, as `fit`'s), the loss
  averaged over the global batch (`tf.nn.compute_average_loss`), tracked by a
  `keras.metrics.Mean` read (all-reduced) once per call, as `fit` reduces its logs.

One job trains `1 + --repeats` epochs of `--steps` steps; the first (tracing) is dropped,
and the job's throughput is the chief's median of global samples per second over the
others, each epoch timed from its start to the next one's (for `fit`, its iterator's
creation and its epoch-end work included: what an epoch costs beyond its steps, which the
loop does not pay). Jobs alternate (kmp, loop, kmp, loop, ...) for
`--rounds` rounds; each round gives a ratio kmp / loop, and the median ratio is reported
with every round's, for each `--steps-per-execution` (default 16 and 1).

    python benchmarks/workers_vs_loop.py [--quick] [--rounds 5] [--repeats 3]
        [--steps 160] [--steps-per-execution 16 1] [--json PATH]

Each job (a fresh `kmp.launch`) trains one model per `steps_per_execution`, in turn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _suite import LOOP, Report, add_arguments, median_ratio

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FEATURES = 64
BATCH = 256


def _data(batch: int, steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, FEATURES)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int64")
    return x, y


def _layers(width: int) -> list:
    import keras

    return [keras.Input((FEATURES,)), keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)]


def kmp_job(steps: int, repeats: int, batch: int, width: int, executions: list[int]) -> dict:
    """One worker of the kmp side: `@kmp.parallelize` and `fit`, a model per `steps_per_execution`."""
    import keras

    import keras_mgpu_plugins as kmp

    @kmp.parallelize  # creates this worker's MultiWorkerMirroredStrategy, before any op
    def build(steps_per_execution: int):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(_layers(width))
        model.compile(optimizer="adam", steps_per_execution=steps_per_execution,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.marks: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.marks.append(time.perf_counter())

        def on_train_end(self, logs=None):
            self.marks.append(time.perf_counter())

    x, y = _data(batch, steps)
    rates, replicas = {}, 0
    for n in executions:
        model = build(n)
        clock = EpochClock()
        model.fit(x, y, batch_size=batch, epochs=1 + repeats, shuffle=False, verbose=0,
                  callbacks=[clock])
        seconds = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
        rates[n] = _rate(seconds, batch, steps)
        replicas = int(model.distribute_strategy.num_replicas_in_sync)
    return _result(rates, replicas)


def loop_job(steps: int, repeats: int, batch: int, width: int, executions: list[int]) -> dict:
    """One worker of the loop side: a hand-written `tf.distribute` training loop per
    `steps_per_execution`."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any op
    x, y = _data(batch, steps)
    rates = {n: _loop(strategy, x, y, steps, repeats, batch, width, n) for n in executions}
    return _result(rates, int(strategy.num_replicas_in_sync))


def _loop(strategy, x, y, steps: int, repeats: int, batch: int, width: int,
          steps_per_execution: int) -> float:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(_layers(width))
        optimizer = keras.optimizers.Adam()
        loss_tracker = keras.metrics.Mean()  # as fit's: updated per step, read per execution
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    # drop_remainder (every batch is full here): without it TensorFlow checks at every step,
    # with an all-reduce, that every worker still has input; fit skips that check for
    # executions of full batches (kmp's full_batch_executions_skip_input_check). One iterator
    # over the repeated dataset for the whole job, as TensorFlow's multi-worker custom-loop
    # tutorial does: a fresh one per epoch costs its creation, and its destruction on this
    # thread (0.38-0.45 s per 160-step epoch here), which fit does off the training thread.
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True))

    def step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(labels, model(features, training=True)),
                                              global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        loss_tracker.update_state(loss)

    # A tf.while_loop written out, as fit's: autograph would need this file's source in
    # the worker, which a function sent by value (run as a script) does not have.
    @tf.function(autograph=False)
    def execution(iterator):
        def body(i):
            strategy.run(step, args=(next(iterator),))
            return i + 1

        tf.while_loop(lambda i: i < steps_per_execution, body, [tf.constant(0)])
        return loss_tracker.result()  # one all-reduce per execution, as fit's logs

    seconds = []
    iterator = iter(dataset)
    for _ in range(1 + repeats):
        start = time.perf_counter()
        loss_tracker.reset_state()
        for _ in range(steps // steps_per_execution):
            execution(iterator)
        seconds.append(time.perf_counter() - start)
    return _rate(seconds, batch, steps)


def measure(steps: int = 160, repeats: int = 3, rounds: int = 5,
            executions: tuple[int, ...] = (16, 1), width: int = 512, batch: int = BATCH,
            timeout: float = 600, report=print) -> dict:
    """Alternates a kmp job and a loop job on 2 workers, `rounds` times (kmp first in even
    rounds); each job trains one model per `steps_per_execution` of `executions`.

    Returns:
        `{"replicas", n: {"kmp", "loop", "ratio", "ratios"}}` for each `n` of `executions`:
        the medians over the rounds of each side's samples/s and of the rounds' ratios
        kmp / loop (each in `ratios`).
    """
    import keras_mgpu_plugins as kmp

    for n in executions:
        if steps % n:
            raise ValueError(f"steps must be a multiple of steps_per_execution. Received: "
                             f"steps={steps}, steps_per_execution={n}")
    args = (steps, repeats, batch, width, list(executions))

    def chief(job) -> dict:
        results = kmp.launch(job, num_workers=2, args=args, timeout=timeout,
                             create_strategy=False)
        return next(r for r in results if r["worker"] == 0)

    found: dict[str, list[dict]] = {"kmp": [], "loop": []}
    for index in range(rounds):
        for side in ("kmp", "loop") if index % 2 == 0 else ("loop", "kmp"):
            found[side].append(chief(kmp_job if side == "kmp" else loop_job))
        if report is not None:
            report(f"  round {index + 1}: " + "  ".join(
                f"spe {n}: kmp {found['kmp'][-1]['rates'][n]:7.0f} loop "
                f"{found['loop'][-1]['rates'][n]:7.0f} samples/s" for n in executions))
    result: dict = {"replicas": found["loop"][-1]["replicas"]}
    for n in executions:
        kmps = [r["rates"][n] for r in found["kmp"]]
        loops = [r["rates"][n] for r in found["loop"]]
        ratio, ratios = median_ratio(kmps, loops)
        result[n] = {"kmp": statistics.median(kmps), "loop": statistics.median(loops),
                     "ratio": ratio, "ratios": ratios}
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=5)
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per job")
    parser.add_argument("--steps", type=int, default=160, help="steps per epoch")
    parser.add_argument("--steps-per-execution", type=int, nargs="+", default=[16, 1])
    args = parser.parse_args(argv)
    steps, repeats, rounds, width = ((32, 1, 1, 64) if args.quick else
                                     (args.steps, args.repeats, args.rounds, 512))
    print(f"2 workers, global batch {BATCH}, {steps} steps x {repeats} timed epochs per "
          f"job, {rounds} rounds, {os.cpu_count()} CPU cores", flush=True)
    r = measure(steps=steps, repeats=repeats, rounds=rounds, width=width,
                executions=tuple(args.steps_per_execution),
                report=lambda line: print(line, flush=True))
    report = Report("workers_vs_loop", "TensorFlow, 2 workers: kmp's fit against a "
                    "hand-written tf.distribute loop", args.quick)
    for n in args.steps_per_execution:
        report.ratio(f"loop_spe{n}", f"kmp fit / tf.distribute loop, samples/s, "
                     f"steps_per_execution={n}", r[n]["ratio"], LOOP, r[n]["ratios"],
                     f"2 workers of kmp.launch, MLP {FEATURES}-{width}-{width}-10, Adam, global "
                     f"batch {BATCH}, {steps}-step epochs, median of the chief's {repeats} "
                     f"timed epochs per job, median of {rounds} alternating rounds")
        report.row(f"kmp fit, steps_per_execution={n}", r[n]["kmp"], "samples/s",
                   f"{r['replicas']} replicas")
        report.row(f"tf.distribute loop, steps_per_execution={n}", r[n]["loop"], "samples/s")
    return report.finish(args.json)


def _rate(epoch_seconds: list[float], batch: int, steps: int) -> float:
    return statistics.median(batch * steps / s for s in epoch_seconds[1:])  # the first traces


def _result(rates: dict, replicas: int) -> dict:
    import keras_mgpu_plugins as kmp

    return {"rates": rates, "replicas": replicas, "worker": kmp.topology().worker_index}


if __name__ == "__main__":
    main()
