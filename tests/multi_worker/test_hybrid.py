"""strategy="hybrid": 2 real workers (kmp.launch) x 2 simulated CPU devices each.

One launched job trains the placed model with every callback and returns what each worker
saw; the test process compares it with one process training the unplaced model on the
same global batches. A killed worker and a relaunch on the same folder check
BackupAndRestore (test_hybrid_backup.py); the errors are in test_hybrid_errors.py.
"""

from __future__ import annotations

import importlib.util
import os
import signal

import numpy as np
import pytest

import keras_mgpu_plugins as kmp

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]

GLOBAL_BATCH = 16
EPOCHS = 3
KILL_EPOCH = 1  # 0-based: worker 1 dies in the second of three epochs
WANDB = importlib.util.find_spec("wandb") is not None
STAGE = {"dense_0": 0, "dense_1": 0, "dense_2": 1, "dense_3": 1, "head": 1}


def make_data(n=64):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, np.tanh(x @ rng.normal(size=(6, 1))).astype("float32")


def mlp():
    """Seeded initialisers: every process, placed or not, starts from the same weights."""
    import keras

    inp = keras.Input((6,))
    h = inp
    for i in range(4):
        h = keras.layers.Dense(8, activation="tanh", name=f"dense_{i}",
                               kernel_initializer=keras.initializers.GlorotUniform(i))(h)
    head = keras.layers.Dense(1, name="head", kernel_initializer=keras.initializers.GlorotUniform(9))
    model = keras.Model(inp, head(h))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse", metrics=["mae"])
    return model


def devices_of(variables):
    """Each variable's path → the devices of its copies on this worker."""
    return {v.path: [c.device for c in v.value.values] for v in variables if len(v.shape)}


def train(out, kill=False, extra=()):
    """Fits the hybrid model with the callbacks; worker 1 dies mid-run when `kill`."""
    import keras

    from keras_mgpu_plugins.callbacks import (
        BackupAndRestore,
        DeviceMetricsLogger,
        ModelCheckpoint,
        WeightSyncVerifier,
    )
    from keras_mgpu_plugins.samplers import ScriptedSampler

    rank = kmp.topology().worker_index

    class Record(keras.callbacks.Callback):
        epochs: list = []

        def on_epoch_begin(self, epoch, logs=None):
            Record.epochs.append(epoch)

        def on_train_batch_begin(self, batch, logs=None):
            if kill and rank == 1 and Record.epochs[-1] == KILL_EPOCH and batch == 1:
                os.kill(os.getpid(), signal.SIGKILL)

    model = kmp.parallelize(strategy="hybrid")(mlp)()
    sampler = ScriptedSampler([{f"CPU:{d}": {"memory_mb": 100.0 * (rank + 1) + d}
                                for d in (0, 1)}])
    verifier = WeightSyncVerifier()
    callbacks = [BackupAndRestore(os.path.join(out, "backup")),
                 ModelCheckpoint(os.path.join(out, "model.keras")), verifier,
                 DeviceMetricsLogger(sampler=sampler, sample_interval=None, summary=False),
                 Record(), *extra]
    x, y = make_data()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(x[:32], y[:32]), callbacks=callbacks)
    return model, {
        "rank": rank, "weights": model.get_weights(), "history": history.history,
        "epochs": list(Record.epochs), "strategy": type(model.distribute_strategy).__name__,
        "replicas": model.distribute_strategy.num_replicas_in_sync,
        "variables": devices_of(model.weights),
        "slots": devices_of(model.optimizer.variables),
        "verified": [(r.where, r.mismatches) for r in verifier.reports],
    }


def job(out, kill=False):
    """The whole scenario on one worker; returns what it saw."""

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks import EarlyStopping, WeightSyncVerifier

    kmp.simulate_devices(2)  # before the strategy, which starts TensorFlow's runtime
    model, seen = train(out, kill)
    report = kmp.placement_report(model)
    seen["report"] = {"text": str(report), "workers": report.num_workers,
                      "devices": [r.device for r in report.rows],
                      "layers": [r.layers for r in report.rows]}
    x, y = make_data()
    # EarlyStopping: loss never improves by 100, so every worker stops after epoch 2
    stopper = EarlyStopping(monitor="loss", min_delta=100, patience=1)
    placed = kmp.parallelize(strategy="hybrid")(mlp)()
    history = placed.fit(x, y, batch_size=GLOBAL_BATCH, epochs=6, verbose=0, callbacks=[stopper])
    seen["early"] = (len(history.history["loss"]), stopper.stopped_epoch)
    # WeightSyncVerifier: worker 1's copy of head/kernel (on its CPU:1) nudged
    if seen["rank"] == 1:
        kernel = model.get_layer("head").kernel
        kernel.assign(kernel.numpy() + 1e-3)
    try:
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
                  callbacks=[WeightSyncVerifier()])
        seen["nudged"] = None
    except kmp.WeightsOutOfSyncError as err:
        seen["nudged"] = [m.path for m in err.mismatches]
    # a placement that differs between workers: every worker raises before a variable moves
    rank = seen["rank"]
    try:
        kmp.parallelize(strategy="hybrid", devices={"dense_0": f"/cpu:{rank}", "*": "/cpu:1"})(
            mlp)()
        seen["differs"] = None
    except ValueError as err:
        seen["differs"] = str(err)
    return seen


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("hybrid")
    return out, kmp.launch(job, num_workers=2, args=(str(out),), create_strategy=False,
                           timeout=200)


@pytest.fixture(scope="module")
def single():
    """One process, the model unplaced, on the same global batches."""
    x, y = make_data()
    model = mlp()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(x[:32], y[:32]))
    return {"weights": model.get_weights(), "history": history.history}


def test_weights_equal_one_process_and_workers_are_bit_identical(results, single):
    _, (chief, other) = results
    assert (chief["strategy"], chief["replicas"]) == ("CollectiveAllReduceStrategy", 2)
    for a, b, want in zip(chief["weights"], other["weights"], single["weights"], strict=True):
        assert np.array_equal(a, b)
        assert np.max(np.abs(a - want)) < 1e-5
    assert chief["history"] == other["history"]
    for key, values in single["history"].items():
        np.testing.assert_allclose(chief["history"][key], values, rtol=1e-5, err_msg=key)


def test_each_worker_holds_its_variables_and_slots_on_both_of_its_devices(results):
    _, workers = results
    for seen in workers:
        task = f"/job:worker/replica:0/task:{seen['rank']}/device:CPU:"
        assert len(seen["variables"]) == 10 and len(seen["slots"]) == 10  # kernels, biases, momenta
        for path, devices in seen["variables"].items():
            assert devices == [task + str(STAGE[path.split("/")[0]])], path
        for path, devices in seen["slots"].items():  # sgd/dense_2_kernel_momentum
            layer = next(name for name in STAGE if path.split("/")[-1].startswith(name + "_"))
            assert devices == [task + str(STAGE[layer])], path


def test_callbacks_work_unchanged(results):
    import keras

    out, (chief, other) = results
    for seen in (chief, other):
        assert seen["verified"] and all(not mismatches for _, mismatches in seen["verified"])
        assert seen["early"] == (2, 1)  # both workers stop together
        assert seen["nudged"] == ["head/kernel"]  # found on worker 1's CPU:1, on every worker
    assert sorted(os.listdir(out)) == ["model.keras"]  # no temporary files; backup deleted
    loaded = keras.models.load_model(str(out / "model.keras"))  # plain Keras, no kmp
    for a, b in zip(loaded.get_weights(), chief["weights"], strict=True):
        np.testing.assert_array_equal(a, b)
    for rank in (0, 1):  # per device per worker, in the chief's logs
        for d in (0, 1):
            key = f"device/worker{rank}/CPU:{d}/memory_mb"
            assert chief["history"][key] == [100.0 * (rank + 1) + d] * EPOCHS, key


def test_placement_report_shows_workers_and_devices(results):
    _, workers = results
    for seen in workers:
        report = seen["report"]
        assert report["workers"] == 2
        assert report["devices"] == ["/device:CPU:0", "/device:CPU:1"]
        assert report["layers"] == [("dense_0", "dense_1"), ("dense_2", "dense_3", "head")]
        assert "2 workers (data parallel) x 2 devices" in report["text"]


def test_a_placement_that_differs_between_workers_fails_on_every_worker(results):
    _, workers = results
    for seen in workers:
        message = seen["differs"]
        assert message is not None and "placed the model differently" in message
        assert "worker 0: dense_0 -> /device:CPU:0; worker 1: dense_0 -> /device:CPU:1" in message
