"""Keras's own file writers given to a 2-worker `fit` (TensorFlow, `kmp.launch`), one shared folder.

Both workers pass the same `keras.callbacks.CSVLogger` and `TensorBoard` paths:
the chief alone writes (Python-level writes are recorded in each process by an
audit hook; each TensorBoard event file carries its writer's process id in its
name), and what it writes is what one process writes. Keras's `ModelCheckpoint`
(on both workers) and `BackupAndRestore` (on the chief only, the tf.keras idiom)
make both workers raise before training, naming kmp's drop-in; the next `fit`
with kmp's `ModelCheckpoint` trains.
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

import keras_mgpu_plugins as kmp

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(300)]

ROWS, BATCH, EPOCHS = 32, 8, 3


def data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    return x, (x @ rng.normal(size=(4, 1))).astype("float32")


def build():
    import keras

    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(3, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(5)),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(6))])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def has_tensorboard():
    """Keras's TensorBoard writes through the `tensorboard` package (TensorFlow 2.21 no
    longer depends on it; the `test` extra installs it)."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def writers(folder):
    import keras

    tensorboard = [keras.callbacks.TensorBoard(os.path.join(folder, "tb"), histogram_freq=1)]
    return [keras.callbacks.CSVLogger(os.path.join(folder, "history.csv")),
            *(tensorboard if has_tensorboard() else [])]


def fit(model, callbacks):
    x, y = data()
    return model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                     validation_data=(x[:16], y[:16]), callbacks=callbacks)


def on_each_worker(folder):
    import sys

    import keras

    from keras_mgpu_plugins.callbacks import ModelCheckpoint

    writes = []

    def audit(event, args):
        if event == "open" and isinstance(args[0], str) and args[0].startswith(folder):
            mode, flags = args[1] or "", args[2] or 0
            if any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                writes.append(os.path.relpath(args[0], folder))

    sys.addaudithook(audit)
    model = kmp.parallelize(build)()
    history = fit(model, writers(folder)).history
    written = sorted(set(writes))  # by the fit with Keras's writers
    refused = {}
    chief = kmp.runtime.of(model).is_chief
    for case, given in {
        "checkpoint_everywhere": [keras.callbacks.ModelCheckpoint(os.path.join(folder, "k.keras"))],
        "backup_on_the_chief": ([keras.callbacks.BackupAndRestore(os.path.join(folder, "backup"))]
                                if chief else []),
    }.items():
        try:
            fit(model, given)
            refused[case] = "fit returned"
        except ValueError as err:
            refused[case] = str(err)
    after = fit(model, [ModelCheckpoint(os.path.join(folder, "best.keras"))]).history["loss"]
    return {"pid": os.getpid(), "writes": written, "history": history,
            "refused": refused, "after": after}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    shared, alone = tmp_path_factory.mktemp("shared"), tmp_path_factory.mktemp("alone")
    results = kmp.launch(on_each_worker, num_workers=2, args=(str(shared),), timeout=240)
    history = fit(build(), writers(str(alone))).history  # one process, plain Keras
    return {"shared": shared, "alone": alone, "workers": results, "history": history}


def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def event_files(folder):
    return sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder)
                  for n in names if n.startswith("events.out.tfevents."))


def scalars(path):
    import tensorflow as tf

    found: dict[str, list[float]] = {}
    for event in tf.compat.v1.train.summary_iterator(str(path)):
        for value in event.summary.value:
            if (value.HasField("tensor") and not value.tensor.tensor_shape.dim
                    and value.metadata.plugin_data.plugin_name == "scalars"):
                found.setdefault(value.tag, []).append(float(tf.make_ndarray(value.tensor)))
    return found


needs_tensorboard = pytest.mark.skipif(not has_tensorboard(), reason="pip install tensorboard")


def test_the_chief_alone_writes_the_csv(job):
    chief, other = job["workers"]
    assert chief["writes"] == ["history.csv"] and other["writes"] == []


@needs_tensorboard
def test_the_chief_alone_writes_the_event_files(job):
    chief, _ = job["workers"]
    files = event_files(job["shared"] / "tb")
    assert {f.split(os.sep)[0] for f in files} == {"train", "validation"}
    assert all(f".{chief['pid']}." in f for f in files), files
    assert len(files) == len(event_files(job["alone"] / "tb"))


def test_the_chiefs_csv_is_the_one_a_single_process_writes(job):
    got, want = rows(job["shared"] / "history.csv"), rows(job["alone"] / "history.csv")
    assert got[0] == want[0] == ["epoch", "loss", "mae", "val_loss", "val_mae"]
    assert len(got) == len(want) == EPOCHS + 1
    np.testing.assert_allclose(np.array(got[1:], float), np.array(want[1:], float), atol=1e-5)
    for worker in job["workers"]:
        for key, values in job["history"].items():
            np.testing.assert_allclose(worker["history"][key], values, atol=1e-5)


@needs_tensorboard
def test_the_chiefs_tensorboard_scalars_are_the_ones_a_single_process_writes(job):
    for run in ("train", "validation"):
        (got,), (want,) = ((job[w] / "tb" / run).glob("events.out.tfevents.*")
                           for w in ("shared", "alone"))
        got, want = scalars(got), scalars(want)
        assert got.keys() == want.keys() and "epoch_loss" in got
        for tag, values in want.items():
            if "histogram" not in tag:
                np.testing.assert_allclose(got[tag], values, atol=1e-5, err_msg=tag)


def test_keras_checkpoints_stop_every_worker_before_training_naming_the_drop_in(job):
    chief, other = (w["refused"] for w in job["workers"])
    for index, refused in enumerate((chief, other)):
        assert "keras.callbacks.ModelCheckpoint -> kmp.callbacks.ModelCheckpoint" in \
            refused["checkpoint_everywhere"]
        assert f"Received (worker {index})" in refused["checkpoint_everywhere"]
    assert "keras.callbacks.BackupAndRestore -> kmp.callbacks.BackupAndRestore" in \
        chief["backup_on_the_chief"]
    assert other["backup_on_the_chief"].startswith(
        "model.fit on several workers: worker(s) 0 were given Keras's ModelCheckpoint or "
        "BackupAndRestore")
    assert not (job["shared"] / "k.keras").exists() and not (job["shared"] / "backup").exists()
    assert job["workers"][0]["after"] == job["workers"][1]["after"]
    assert (job["shared"] / "best.keras").is_file()
