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
        [--steps 160] [--steps-per-execution 16 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

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


def _result(epoch_seconds: list[float], batch: int, steps: int, replicas: int) -> dict:
    import keras_mgpu_plugins as kmp

    rates = [batch * steps / s for s in epoch_seconds[1:]]  # the first epoch traces
    return {"samples_per_sec": statistics.median(rates), "replicas": replicas,
            "worker": kmp.topology().worker_index}


def kmp_job(steps: int, repeats: int, batch: int, width: int, steps_per_execution: int) -> dict:
    """One worker of the kmp side: `@kmp.parallelize` and `fit`."""
    import keras

    import keras_mgpu_plugins as kmp

    @kmp.parallelize  # creates this worker's MultiWorkerMirroredStrategy, before any op
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(_layers(width))
        model.compile(optimizer="adam", steps_per_execution=steps_per_execution,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model = build()
    x, y = _data(batch, steps)

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.marks: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.marks.append(time.perf_counter())

        def on_train_end(self, logs=None):
            self.marks.append(time.perf_counter())

    clock = EpochClock()
    model.fit(x, y, batch_size=batch, epochs=1 + repeats, shuffle=False, verbose=0,
              callbacks=[clock])
    seconds = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
    return _result(seconds, batch, steps, int(model.distribute_strategy.num_replicas_in_sync))


def loop_job(steps: int, repeats: int, batch: int, width: int, steps_per_execution: int) -> dict:
    """One worker of the loop side: a hand-written `tf.distribute` training loop."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any op
    import keras

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(_layers(width))
        optimizer = keras.optimizers.Adam()
        loss_tracker = keras.metrics.Mean()  # as fit's: updated per step, read per execution
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    x, y = _data(batch, steps)
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
    return _result(seconds, batch, steps, int(strategy.num_replicas_in_sync))


def measure(steps: int = 160, repeats: int = 3, rounds: int = 5, steps_per_execution: int = 16,
            width: int = 512, batch: int = BATCH, timeout: float = 600,
            report=print) -> dict:
    """Alternates a kmp job and a loop job on 2 workers, `rounds` times.

    Returns:
        `{"kmp", "loop", "ratio", "ratios", "replicas"}`: the medians over the rounds of
        each side's samples/s and of the rounds' ratios kmp / loop (each in `ratios`).
    """
    import keras_mgpu_plugins as kmp

    if steps % steps_per_execution:
        raise ValueError(f"steps must be a multiple of steps_per_execution. Received: "
                         f"steps={steps}, steps_per_execution={steps_per_execution}")
    args = (steps, repeats, batch, width, steps_per_execution)

    def chief(job) -> dict:
        results = kmp.launch(job, num_workers=2, args=args, timeout=timeout,
                             create_strategy=False)
        return next(r for r in results if r["worker"] == 0)

    kmps, loops, replicas = [], [], 0
    for index in range(rounds):
        kmps.append(chief(kmp_job)["samples_per_sec"])
        loop = chief(loop_job)
        loops.append(loop["samples_per_sec"])
        replicas = loop["replicas"]
        if report is not None:
            report(f"  round {index + 1}: kmp {kmps[-1]:9.0f}  loop {loops[-1]:9.0f} samples/s"
                   f"  ratio {kmps[-1] / loops[-1]:.3f}")
    ratios = [a / b for a, b in zip(kmps, loops, strict=True)]
    return {"kmp": statistics.median(kmps), "loop": statistics.median(loops),
            "ratio": statistics.median(ratios), "ratios": ratios, "replicas": replicas}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 2 epochs of 160 steps")
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the two jobs")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per job")
    parser.add_argument("--steps", type=int, default=160, help="steps per epoch")
    parser.add_argument("--steps-per-execution", type=int, nargs="+", default=[16, 1])
    args = parser.parse_args(argv)
    rounds, repeats = (1, 2) if args.quick else (args.rounds, args.repeats)
    print(f"2 workers, global batch {BATCH}, {args.steps} steps x {repeats} timed epochs per "
          f"job, {rounds} rounds, {os.cpu_count()} CPU cores", flush=True)
    for n in args.steps_per_execution:
        print(f"steps_per_execution={n}", flush=True)
        r = measure(steps=args.steps, repeats=repeats, rounds=rounds, steps_per_execution=n,
                    report=lambda line: print(line, flush=True))
        print(f"  kmp fit   {r['kmp']:10.0f} samples/s (median of rounds, {r['replicas']} replicas)")
        print(f"  tf loop   {r['loop']:10.0f} samples/s")
        print(f"  ratio kmp / loop: {r['ratio']:.3f} (rounds: "
              f"{', '.join(f'{x:.3f}' for x in r['ratios'])})", flush=True)


if __name__ == "__main__":
    main()
