"""The legacy multi-GPU recipe (Keras 2 era), with only its import changed.

The recipe: build the template model on the CPU, replicate it with
`multi_gpu_model(model, gpus=2)`, compile and fit the parallel model, checkpoint
and save through the template. `keras.utils.multi_gpu_model` was removed in
TensorFlow 2.4; `kmp.multi_gpu_model` runs the same code on MirroredStrategy.

Runs anywhere: without 2 GPUs, `kmp.simulate_devices(2)` splits the CPU (or the
one GPU) into 2 logical devices. The data are scikit-learn's 8x8 digits
(shipped with scikit-learn, nothing is downloaded).

    python examples/legacy_multi_gpu_model.py               # 20 epochs, ~20 s on 2 CPU cores
    python examples/legacy_multi_gpu_model.py --quick       # 3 epochs, for tests
    python examples/legacy_multi_gpu_model.py --out runs/   # keep the saved models

It prints, last, one line of JSON with what it saved and the checks it made.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import keras_mgpu_plugins as kmp


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 epochs (for tests)")
    parser.add_argument(
        "--out", default=None, help="folder for the saved models (default: a temp dir)"
    )
    return parser.parse_args(argv)


def load_data():
    import keras
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")  # (1797, 64)
    y = keras.utils.to_categorical(digits.target, 10)
    return (x[:1536], y[:1536]), (x[1536:], y[1536:])


def main(argv=None) -> dict:
    args = parse_args(argv)
    import tensorflow as tf

    if len(tf.config.list_physical_devices("GPU")) < 2:
        kmp.simulate_devices(2)  # before TensorFlow's runtime starts
    import keras

    # The one change. Was: from keras.utils import multi_gpu_model
    from keras_mgpu_plugins import multi_gpu_model
    from keras_mgpu_plugins.callbacks import EarlyStopping, ParallelModelCheckpoint

    epochs = 3 if args.quick else args.epochs
    out = args.out or tempfile.mkdtemp(prefix="kmp-legacy-")
    os.makedirs(out, exist_ok=True)
    best_path = os.path.join(out, "best.keras")
    (x, y), (x_test, y_test) = load_data()
    keras.utils.set_random_seed(0)

    # --- the recipe, as it was written -------------------------------------------
    with tf.device("/cpu:0"):  # the template's weights in host memory
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
    parallel_model = multi_gpu_model(model, gpus=2)
    parallel_model.compile(
        loss="categorical_crossentropy", optimizer="rmsprop", metrics=["accuracy"]
    )
    callbacks = [
        ParallelModelCheckpoint(model, best_path, monitor="val_loss", save_best_only=True),
        EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True),
    ]
    # batch_size is the global batch: 256 = 2 replicas x 128
    history = parallel_model.fit(
        x,
        y,
        epochs=epochs,
        batch_size=256,
        validation_split=0.2,
        callbacks=callbacks,
        verbose=2,
    )
    model.save(os.path.join(out, "my_model.keras"))  # save through the template
    # -------------------------------------------------------------------------------

    best = keras.saving.load_model(best_path)
    template_is_best = all(
        (a == b).all() for a, b in zip(model.get_weights(), best.get_weights(), strict=True)
    )
    template_is_trained = all(
        (a == b).all()
        for a, b in zip(model.get_weights(), parallel_model.get_weights(), strict=True)
    )
    model.compile(loss="categorical_crossentropy", metrics=["accuracy"])
    _, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    val_loss = history.history["val_loss"]
    result = {
        "replicas": parallel_model.distribute_strategy.num_replicas_in_sync,
        "epochs_run": len(val_loss),
        "best_epoch": int(min(range(len(val_loss)), key=val_loss.__getitem__)) + 1,
        "template_equals_parallel": bool(template_is_trained),
        "template_equals_best_checkpoint": bool(template_is_best),
        "test_accuracy": round(float(accuracy), 4),
        "my_model": os.path.join(out, "my_model.keras"),
        "best_checkpoint": best_path,
    }
    print(
        f"Trained on {result['replicas']} replicas; the template holds the best epoch's "
        f"weights ({result['best_epoch']}): {template_is_best}; test accuracy {accuracy:.3f}"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
