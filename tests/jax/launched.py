"""Functions `kmp.launch` runs in each JAX worker (importable, so they travel by reference)."""

from __future__ import annotations

import json
import os

import numpy as np

ROWS, BATCH, EPOCHS = 20, 8, 3


def who_and_what_is_bound() -> dict:
    """jax.distributed as the bootstrap left it, kmp.topology(), the listening sockets."""
    import jax

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins import runtime
    from tests.multi_worker.test_launch_exposure import listening_sockets, socket_inodes

    run = runtime.of()
    run.barrier()  # every process has its sockets up
    listening = listening_sockets()
    mine, launcher = socket_inodes(os.getpid()), socket_inodes(os.getppid())
    topology = kmp.topology()
    found = {
        "jax": [jax.distributed.is_initialized(), jax.process_index(), jax.process_count()],
        "topology": [topology.worker_index, topology.num_workers, topology.is_chief],
        "cluster": json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"],
        "worker": [s for s in listening if s["inode"] in mine],
        "launcher": [s for s in listening if s["inode"] in launcher],
    }
    run.barrier()  # no process exits (closing its sockets) before the other has read
    return found


def fail_on_worker_one() -> str:
    """Worker 1 raises; worker 0 waits for it in a collective, forever unless stopped."""
    from keras_mgpu_plugins import runtime

    run = runtime.of()
    if run.rank().worker_index == 1:
        raise ValueError("worker one broke on purpose")
    run.all_gather(np.ones(1))
    return "worker 0 went on"


def _model(optimizer: str):
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05) if optimizer == "sgd" else keras.optimizers.Adam(0.01),
                  "mse")
    return model


def shuffled_fit(mode, optimizer: str = "sgd") -> dict:
    """fit(shuffle=mode) on 2 processes, with the global order of each pass kmp fed; then
    Keras's own fit(shuffle=mode) on one device (no distribution) in this process, seeded
    alike."""
    import keras

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.inputs import shuffle

    orders, real = [], shuffle.agreed

    def agreed(order, runtime):
        orders.append(real(order, runtime).tolist())
        return np.asarray(orders[-1])

    shuffle.agreed = agreed
    x = np.random.default_rng(0).normal(size=(ROWS, 3)).astype("float32")
    y = (x @ np.array([[0.5], [-1.0], [2.0]], "float32")).astype("float32")
    model = kmp.parallelize(_model)(optimizer)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=mode)
    shuffle.agreed = real
    weights = [w.tolist() for w in model.get_weights()]
    keras.distribution.set_distribution(None)
    reference = _model(optimizer)
    alone = reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=mode)
    return {"orders": orders, "weights": weights, "history": history.history,
            "reference": [w.tolist() for w in reference.get_weights()],
            "reference_history": alone.history}
