"""`@kmp.parallelize` against the hand-written strategy scope: the same step time.

Builds one model twice over the same 2 devices (2 logical CPUs when there are
fewer than 2 GPUs): once by a factory decorated with
`@kmp.parallelize(strategy="mirrored")`, once as users write it by hand,
`with tf.distribute.MirroredStrategy(devices).scope(): build; compile`. After a
warm-up fit each (tracing), trains each `--repeats` times, alternating which
goes first, and prints the median time per step of both (the median of the
intervals between consecutive batch starts over every fit: robust to the
bursts of a shared machine) and their ratio, measured in this one run. The
decorator only runs the factory in the scope, so the ratio should be 1 within
noise.

    python benchmarks/parallelize_overhead.py [--quick] [--repeats 10] [--steps 50] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _suite import PLAIN, Report, add_arguments

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FEATURES = 64


def build(width: int):
    """The model both ways build: an MLP compiled with Adam."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def step_clock():
    """A Keras callback noting when each batch starts (its only per-batch work).

    `clock.intervals()` gives the times between consecutive batch starts.
    """
    import keras
    import numpy as np

    class StepClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.starts: list[float] = []

        def on_train_batch_begin(self, batch, logs=None):
            self.starts.append(time.perf_counter())

        def intervals(self) -> list[float]:
            return [float(d) for d in np.diff(self.starts)]

    return StepClock()


def measure(repeats: int = 10, steps: int = 50, batch: int = 256, width: int = 512) -> dict:
    """Median seconds per step of both models, and their ratio.

    Needs 2 local devices (call `kmp.simulate_devices(2)` first on a machine
    with fewer than 2 GPUs).

    Returns:
        `{"replicas", "step_s_parallelize", "step_s_hand", "ratio"}`, the
        ratio being parallelize / hand.
    """
    import numpy as np
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    decorated = kmp.parallelize(strategy="mirrored")(build)(width)
    devices = decorated.distribute_strategy.extended.worker_devices
    with tf.distribute.MirroredStrategy(devices=list(devices)).scope():
        hand = build(width)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, FEATURES)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int64")

    def step_intervals(model) -> list[float]:
        clock = step_clock()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[clock])
        return clock.intervals()

    models = {"parallelize": decorated, "hand": hand}
    for model in models.values():
        step_intervals(model)  # traces the train function
    times: dict[str, list[float]] = {name: [] for name in models}
    for r in range(repeats):
        for name in (("parallelize", "hand") if r % 2 == 0 else ("hand", "parallelize")):
            times[name] += step_intervals(models[name])
    decorated_s, hand_s = (statistics.median(times[n]) for n in ("parallelize", "hand"))
    return {
        "replicas": int(decorated.distribute_strategy.num_replicas_in_sync),
        "step_s_parallelize": decorated_s,
        "step_s_hand": hand_s,
        "ratio": decorated_s / hand_s,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=None)
    parser.add_argument("--repeats", type=int, default=10, help="fits per model")
    parser.add_argument("--steps", type=int, default=50, help="steps per fit")
    parser.add_argument("--rounds", type=int, default=None, help="the same as --repeats")
    args = parser.parse_args(argv)
    import tensorflow as tf

    import keras_mgpu_plugins as kmp

    if len(tf.config.list_physical_devices("GPU")) < 2:
        kmp.simulate_devices(2)
    repeats, steps = (2, 8) if args.quick else (args.rounds or args.repeats, args.steps)
    result = measure(repeats=repeats, steps=steps)
    print(f"{result['replicas']} replicas, {steps} steps x {repeats} fits per model")
    print(f"  @kmp.parallelize     {1e3 * result['step_s_parallelize']:8.2f} ms/step")
    print(f"  hand-written scope   {1e3 * result['step_s_hand']:8.2f} ms/step")
    report = Report("parallelize_overhead", "TensorFlow, 2 devices of one process: "
                    "@kmp.parallelize against the hand-written strategy scope", args.quick)
    report.ratio("parallelize", "@kmp.parallelize / tf.distribute.MirroredStrategy scope by "
                 "hand, speed per step", 1 / result["ratio"], PLAIN, [],
                 f"{result['replicas']} replicas, MLP {FEATURES}-512-512-10, Adam, batch 256, "
                 f"median of the intervals between batch starts over {repeats} alternating fits "
                 f"of {steps} steps each")
    report.row("@kmp.parallelize", 1e3 * result["step_s_parallelize"], "ms a step")
    report.row("hand-written scope", 1e3 * result["step_s_hand"], "ms a step")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
