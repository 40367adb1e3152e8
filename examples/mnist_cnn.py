"""Distributed CNN training: the MirroredStrategy MNIST recipe, with @kmp.parallelize.

The recipe (Conv2D 32 3x3 -> MaxPool -> Flatten -> Dense 128 -> Dense 10, Adam,
sparse categorical cross-entropy, `tf.data` with prefetching, `validation_data`)
as it is usually written::

    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = build_model()          # build and compile inside the scope
    model.fit(train_dataset, epochs=10, validation_data=val_dataset)

and here: the factory carries `@kmp.parallelize`, which picks the strategy
(MirroredStrategy over the local GPUs, MultiWorkerMirroredStrategy when the
script runs as one worker of several), so the same file runs unchanged on one
machine and on several::

    python examples/mnist_cnn.py                       # every local GPU, or 2 simulated devices
    kmp-launch -n 2 examples/mnist_cnn.py --quick      # 2 workers on this machine
    python examples/mnist_cnn.py --mnist               # the real MNIST (downloads it once)

Without `--mnist` the data are scikit-learn's 8x8 digits (shipped with
scikit-learn, nothing is downloaded) scaled 3x and padded to 28x28, the shape of
MNIST. The last line printed (by the chief) is one line of JSON with what was
trained and saved.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np

import keras_mgpu_plugins as kmp

IMAGE_SHAPE = (28, 28, 1)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="2 epochs on 512 images (for tests)")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument("--devices", type=int, default=2,
                        help="logical devices to simulate when this machine has fewer GPUs")
    parser.add_argument("--mnist", action="store_true",
                        help="train on the real MNIST (keras.datasets: needs the network once)")
    parser.add_argument("--out", default=None, help="folder for the checkpoint (default: a temp dir)")
    return parser.parse_args(argv)


def digits_as_mnist():
    """scikit-learn's 1797 8x8 digits, upscaled 3x and padded to 28x28, in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images / 16.0, np.ones((3, 3)))  # (1797, 24, 24)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))[..., None].astype("float32")
    labels = digits.target.astype("int64")
    return (images[:1536], labels[:1536]), (images[1536:], labels[1536:])


def real_mnist():
    import keras

    (x, y), (x_val, y_val) = keras.datasets.mnist.load_data()
    scale = lambda a: (a / 255.0).astype("float32")[..., None]  # noqa: E731
    return (scale(x), y.astype("int64")), (scale(x_val), y_val.astype("int64"))


def load_data(mnist: bool = False):
    """`(x, y), (x_val, y_val)`: images (N, 28, 28, 1) float32 in [0, 1], labels int64."""
    return real_mnist() if mnist else digits_as_mnist()


def make_dataset(x, y, global_batch: int, training: bool):
    """A `tf.data` pipeline: shuffled, batched by the global batch, prefetched.

    Under several workers Keras shards it across workers (the DATA policy:
    each worker keeps its share of every global batch).
    """
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if training:
        dataset = dataset.shuffle(len(x), seed=0, reshuffle_each_iteration=True)
    dataset = dataset.batch(global_batch).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def strategy_name(strategy) -> str:
    """The public name of a strategy's class (TensorFlow's own names differ)."""
    import tensorflow as tf

    for name in ("MultiWorkerMirroredStrategy", "MirroredStrategy"):
        if isinstance(strategy, getattr(tf.distribute, name)):
            return name
    return type(strategy).__name__


@kmp.parallelize  # was: `with tf.distribute.MirroredStrategy().scope():` around the call
def build_model(learning_rate: float = 1e-3):
    import keras

    model = keras.Sequential(
        [
            keras.Input(IMAGE_SHAPE),
            keras.layers.Conv2D(32, (3, 3), activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(argv=None) -> dict:
    args = parse_args(argv)
    import tensorflow as tf

    topo = kmp.topology()
    if not topo.is_multi_worker and len(tf.config.list_physical_devices("GPU")) < 2:
        kmp.simulate_devices(args.devices)  # before TensorFlow's runtime starts
    import keras

    epochs = 2 if args.quick else args.epochs
    out = args.out or tempfile.mkdtemp(prefix="kmp-mnist-")
    (x, y), (x_val, y_val) = load_data(mnist=args.mnist)
    if args.quick:
        x, y = x[:512], y[:512]
    keras.utils.set_random_seed(0)

    model = build_model()
    strategy = model.distribute_strategy
    chief = kmp.topology().is_chief
    if chief:
        print(f"{strategy_name(strategy)}: {strategy.num_replicas_in_sync} replicas, "
              f"{topo.num_workers} worker(s), global batch {args.batch_size}, "
              f"{args.batch_size // strategy.num_replicas_in_sync} per replica")
    checkpoint = os.path.join(out, "best.keras")
    history = model.fit(
        make_dataset(x, y, args.batch_size, training=True),
        epochs=epochs,
        validation_data=make_dataset(x_val, y_val, args.batch_size, training=False),
        callbacks=[
            kmp.callbacks.ModelCheckpoint(checkpoint, monitor="val_accuracy", save_best_only=True),
            kmp.callbacks.EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True),
        ],
        verbose=2 if chief else 0,
    )
    result = {
        "strategy": strategy_name(strategy),
        "replicas": int(strategy.num_replicas_in_sync),
        "workers": topo.num_workers,
        "epochs_run": len(history.history["loss"]),
        "train_images": len(x),
        "val_accuracy": [round(float(v), 4) for v in history.history["val_accuracy"]],
        "checkpoint": checkpoint,
    }
    if chief:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
