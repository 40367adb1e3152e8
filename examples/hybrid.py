"""Hybrid parallelism: workers train data parallel, each with the model split over its devices.

    kmp-launch -n 2 --no-strategy examples/hybrid.py --quick
    kmp-launch -n 2 --no-strategy examples/hybrid.py --epochs 5 --out runs/hybrid

Every worker runs this file. `@kmp.parallelize(strategy="hybrid")` places the model over
the worker's own devices in contiguous stages (as `"model_parallel"` does), inside a
multi-worker strategy with one replica per worker: `fit` gives each worker its half of
every global batch and averages the gradients across workers once per step.
`--no-strategy` lets the decorator create that strategy (the launcher's default one would
replicate over every GPU instead).

Without GPUs each worker splits its CPU into 2 logical devices (`--devices 2`); with GPUs,
every local GPU is a stage (or `--devices N` splits the first one, for a try-out).

The chief prints its placement report (every worker's plan is checked to be the same),
then each worker prints one line of JSON: the devices of its variables, a SHA-256 of its
weights, its losses. kmp-launch shows the chief's output; worker 1's is in its log file
(path printed; `--all-output` shows every worker's). The chief alone writes `model.keras`
(loadable in plain Keras) in `--out`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile

import numpy as np

import keras_mgpu_plugins as kmp


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--devices", type=int, default=None,
                        help="simulated devices per worker (default: 2 without a GPU)")
    parser.add_argument("--out", default=None, help="a folder every worker sees")
    parser.add_argument("--quick", action="store_true", help="1 epoch on little data (tests)")
    return parser.parse_args(argv)


def build_model(width: int = 256, depth: int = 4):
    """A deep MLP: its layers split in stages over this worker's devices."""
    import keras

    inputs = keras.Input((32,))
    h = inputs
    for i in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"block_{i}",
                               kernel_initializer=keras.initializers.GlorotUniform(i))(h)
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(h))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def sha256(weights) -> str:
    digest = hashlib.sha256()
    for array in weights:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def main(argv=None) -> dict:
    args = parse_args(argv)
    simulate(args.devices)  # first: before the decorator below starts TensorFlow
    topology = kmp.topology()
    out = args.out or os.path.join(tempfile.gettempdir(),
                                   f"kmp-hybrid-{os.environ.get('KMP_JOB_ID', 'local')}")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)  # the same data on every worker: each trains on its share
    n, epochs = (256, 1) if args.quick else (4096, args.epochs)
    x = rng.normal(size=(n, 32)).astype("float32")
    y = (x[:, :10].argmax(axis=1)).astype("int64")

    model = kmp.parallelize(strategy="hybrid")(build_model)()
    checkpoint = kmp.callbacks.ModelCheckpoint(os.path.join(out, "model.keras"))
    verifier = kmp.callbacks.WeightSyncVerifier()
    history = model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=2,
                        callbacks=[checkpoint, verifier])
    result = {
        "worker": topology.worker_index, "workers": topology.num_workers,
        "devices": {v.path: v.value.device for v in model.weights},
        "weights_sha256": sha256(model.get_weights()),
        "loss": history.history["loss"],
        "verifier_mismatches": sum(len(r.mismatches) for r in verifier.reports),
        "out": out,
    }
    print(json.dumps(result), flush=True)
    return result


def simulate(count: int | None) -> None:
    """Splits this worker's device in `count` (default: 2 CPU devices without a GPU)."""
    import tensorflow as tf

    if count is None and not tf.config.list_physical_devices("GPU"):
        count = 2
    if count:
        kmp.simulate_devices(count)


if __name__ == "__main__":
    main()
