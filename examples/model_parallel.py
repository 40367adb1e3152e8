"""Model parallelism on one machine: device-parallel branches, then a model split over devices.

Part 1 is the Keras 2 era recipe (a shared LSTM called on two devices, the merge on the
host) inside a factory decorated with `@kmp.parallelize(strategy="model_parallel")`: the
`tf.device` scopes now hold in `fit`, not only while building. Part 2 is a model whose
parameters and Adam slots need twice what one device is given: placed automatically in
stages over the devices, each device holds about a third of it.

Without 3 GPUs, `kmp.simulate_devices(3)` splits the CPU into 3 logical devices (or the
first GPU into 3 logical GPUs), so the same code runs on a laptop.

    python examples/model_parallel.py            # ~1 min on 2 CPU cores
    python examples/model_parallel.py --quick    # a few steps, for tests
"""

from __future__ import annotations

import argparse
import json

import keras_mgpu_plugins as kmp


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 epoch on little data (tests)")
    return parser.parse_args(argv)


def recipe_factory(first: str, second: str):
    """The recipe, unchanged but for the device names (this machine's)."""

    @kmp.parallelize(strategy="model_parallel")
    def build_model():
        import keras
        import tensorflow as tf

        tweet_a = keras.Input(shape=(20, 32))
        tweet_b = keras.Input(shape=(20, 32))
        shared_lstm = keras.layers.LSTM(64)
        with tf.device(first):
            encoded_a = shared_lstm(tweet_a)
        with tf.device(second):
            encoded_b = shared_lstm(tweet_b)
        with tf.device("/cpu:0"):
            merged_vector = keras.layers.concatenate([encoded_a, encoded_b], axis=-1)
        predictions = keras.layers.Dense(1, activation="sigmoid")(merged_vector)
        model = keras.Model(inputs=[tweet_a, tweet_b], outputs=predictions)
        model.compile(optimizer="rmsprop", loss="binary_crossentropy", metrics=["accuracy"])
        return model

    return build_model


@kmp.parallelize(strategy="model_parallel", micro_batches=4)
def big_model(width: int = 512, depth: int = 6):
    """A deep MLP placed automatically: contiguous stages, balanced by memory."""
    import keras

    inputs = keras.Input((width,))
    h = inputs
    for i in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"block_{i}")(h)
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(h))
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main(argv=None) -> dict:
    args = parse_args(argv)
    devices = kmp.simulate_devices(3)  # before TensorFlow starts
    import numpy as np

    rng = np.random.default_rng(0)
    n, epochs = (64, 1) if args.quick else (1024, args.epochs)

    # Part 1: the recipe; the two LSTM calls run on devices 1 and 2, the merge on the host.
    recipe = recipe_factory(devices[1], devices[2])()
    tweets = [rng.normal(size=(n, 20, 32)).astype("float32") for _ in range(2)]
    same = rng.integers(0, 2, size=(n, 1)).astype("float32")
    history = recipe.fit(tweets, same, batch_size=32, epochs=epochs, verbose=2)
    recipe_report = kmp.placement_report(recipe)

    # Part 2: twice one device's share, split over the 3 devices.
    model = big_model()
    report = kmp.placement_report(model, batch_size=64)
    need = sum(r.parameter_bytes + r.optimizer_bytes for r in report.rows)
    share = need // 2  # what one device is given here: half the model
    x = rng.normal(size=(n * 2, 512)).astype("float32")
    y = rng.integers(0, 10, size=(n * 2,))
    before = model.get_layer("block_0").kernel.numpy().copy()
    big = model.fit(x, y, batch_size=64, epochs=epochs, verbose=2)
    report = kmp.placement_report(model, batch_size=64)  # optimizer bytes now measured
    held = {r.device: r.parameter_bytes + r.optimizer_bytes for r in report.rows}
    print(f"\nParameters + Adam slots: {need / 2**20:.1f} MiB, 2.0x a device's share of "
          f"{share / 2**20:.1f} MiB. Held per device once placed:")
    for device, size in held.items():
        print(f"  {device}: {size / 2**20:.1f} MiB ({size / share:.0%} of the share)")
    result = {
        "recipe": {r.device: list(r.layers) for r in recipe_report.rows},
        "recipe_loss": history.history["loss"][-1],
        "need": need, "share": share, "held": held,
        "big_loss": big.history["loss"][-1],
        "big_changed": bool(np.abs(model.get_layer("block_0").kernel.numpy() - before).max()),
        "bubble": report.bubble_fraction,
    }
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
