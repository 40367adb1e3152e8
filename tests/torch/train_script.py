"""A training script as a user writes it for one process, run unchanged under `kmp-launch -n 2`,
`torchrun --nproc-per-node 2` and alone: `python train_script.py OUT_FOLDER`."""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_mgpu_plugins as kmp  # noqa: E402


@kmp.parallelize
def build_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


def main(out: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 4)).astype("float32")
    y = (x.sum(1, keepdims=True) > 0).astype("float32")
    model = build_model()
    checkpoint = kmp.callbacks.ModelCheckpoint(os.path.join(out, "model-{epoch}.keras"))
    history = model.fit(x, y, batch_size=6, epochs=3, shuffle=False, verbose=0,
                        callbacks=[checkpoint], validation_split=0.2)
    topology = kmp.topology()
    np.savez(os.path.join(out, f"rank{topology.worker_index}.npz"),
             *model.get_weights(), history=json.dumps(history.history),
             topology=json.dumps([topology.worker_index, topology.num_workers,
                                  topology.is_chief, topology.source]),
             predict=model.predict(x, batch_size=6, verbose=0))


if __name__ == "__main__":
    main(sys.argv[1])
