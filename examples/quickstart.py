"""Quickstart: a small CNN trained on 2 devices with @kmp.parallelize and the callbacks.

Runs anywhere, on every Keras backend: without GPUs, `kmp.simulate_devices(2)` splits
the CPU into two logical devices, and the model is replicated over them exactly as it
would be over two GPUs (TensorFlow: `MirroredStrategy`; JAX: `keras.distribution`'s
`DataParallel`). Keras on torch trains one device per process: there the script runs
itself on 2 processes (`kmp.launch`, gloo on CPUs), as `kmp-launch -n 2` or `torchrun
--nproc-per-node 2` would run it. The data are scikit-learn's 8x8 digits (shipped with
the package, nothing is downloaded).

    pip install -e ".[tensorflow,examples]"              # or ".[jax,examples]", ".[torch,examples]"
    python examples/quickstart.py                        # TensorFlow, ~30 s on 2 CPU cores
    KERAS_BACKEND=jax python examples/quickstart.py      # JAX
    KERAS_BACKEND=torch python examples/quickstart.py    # torch: 2 processes
    KERAS_BACKEND=torch kmp-launch -n 2 examples/quickstart.py  # the same, launched by hand
    python examples/quickstart.py --quick                # 2 epochs, for tests
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import keras_mgpu_plugins as kmp

BATCH_SIZE = 64  # global: split over the devices


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="2 epochs (for tests)")
    parser.add_argument("--devices", type=int, default=2, help="logical devices to simulate")
    parser.add_argument("--out", default=None, help="folder for checkpoints (default: a temp dir)")
    return parser.parse_args(argv)


def load_digits():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]  # (1797, 8, 8, 1)
    y = digits.target.astype("int32")
    # 1536 / 256 rows: whole batches of 64 (JAX's devices split every batch evenly)
    return (x[:1536], y[:1536]), (x[1536:1792], y[1536:1792])


@kmp.parallelize  # the one-line change: built and compiled under the right strategy
def build_model(learning_rate: float = 1e-3):
    import keras

    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
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
    topology = kmp.topology()  # starts nothing
    gpus = [d for d in topology.local_devices if d.startswith("GPU")]
    if _keras_backend() == "torch" and not topology.is_multi_worker and not os.environ.get(
            "KMP_LAUNCH_WORKER"):
        # One device per process on torch: this same function on `--devices` processes
        # (unless a launcher started this process already: `kmp-launch -n 1`, kmp-verify).
        argv = sys.argv[1:] if argv is None else argv
        return kmp.launch(main, num_workers=args.devices, args=(argv,))[0]
    if len(gpus) < 2 and not topology.is_multi_worker:  # (kmp-launch -n N: a device each)
        kmp.simulate_devices(args.devices)  # before the backend's runtime starts
    epochs = 2 if args.quick else args.epochs
    out = args.out or tempfile.mkdtemp(prefix="kmp-quickstart-")
    (x, y), (x_val, y_val) = load_digits()

    model = build_model()
    import keras

    print(
        f"Training on {kmp.runtime.of(model).replicas_in_sync} replicas "
        f"(Keras backend: {keras.backend.backend()}), global batch {BATCH_SIZE}"
    )
    callbacks = [
        kmp.callbacks.ModelCheckpoint(
            os.path.join(out, "best.keras"), monitor="val_accuracy", save_best_only=True
        ),
        kmp.callbacks.EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True),
        kmp.callbacks.WeightSyncVerifier(),
        # step_time/mean_ms and samples/s in the logs on every backend (its end-of-run table
        # of every device: summary=True)
        kmp.callbacks.DeviceMetricsLogger(batch_size=BATCH_SIZE, summary=False),
    ]
    history = model.fit(
        x, y, batch_size=BATCH_SIZE, epochs=epochs, validation_data=(x_val, y_val),
        callbacks=callbacks, verbose=2,
    )
    loss, accuracy = model.evaluate(x_val, y_val, batch_size=BATCH_SIZE, verbose=0)
    print(timing(history.history))
    print(f"validation accuracy {accuracy:.3f}; best checkpoint: {os.path.join(out, 'best.keras')}")
    return {"history": history.history, "val_accuracy": accuracy, "out": out}


def timing(logs: dict) -> str:
    """Why Keras's "ms/step" and kmp's `step_time/mean_ms` differ (both in the lines above)."""
    step_ms, rate = logs["step_time/mean_ms"][-1], logs["throughput/samples_per_sec"][-1]
    per_replica = logs.get("throughput/samples_per_sec_per_replica", [float("nan")])[-1]
    return (f"Last epoch: {step_ms:.1f} ms per training step (step_time/mean_ms: from one "
            f"training step's start to the next's), {rate:.0f} samples/s ({per_replica:.0f} per "
            f"replica); Keras's ms/step is the epoch's wall time over its steps, so it also "
            f"counts validation, the callbacks and, in epoch 1, compiling the step")


def _keras_backend() -> str:
    import keras  # reads the backend; starts no runtime (simulate_devices may still follow)

    return keras.backend.backend()


if __name__ == "__main__":
    main()
