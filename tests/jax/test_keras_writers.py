"""Keras's own file writers given to `fit` on 2 JAX processes (`kmp.launch`), one shared folder.

Both processes pass the same `keras.callbacks.CSVLogger` path: process 0 alone
writes it (Python-level writes recorded in each process by an audit hook), and
it holds what one process writes. Keras's `ModelCheckpoint` (on both) and
`BackupAndRestore` (on process 0 only) make both processes raise before
training, naming kmp's drop-in; the next `fit` with kmp's `ModelCheckpoint`
trains. (Keras's `TensorBoard` writes through TensorFlow, absent from this lane:
the TensorFlow lane tests it, `tests/multi_worker/test_keras_writers.py`.)
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.jax import callbacks_job as job
from tests.jax import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(300)]


def fit(model, callbacks):
    x, y = job.data()
    return model.fit(x, y, batch_size=job.BATCH, epochs=job.EPOCHS, shuffle=False, verbose=0,
                     callbacks=callbacks)


def on_each_process(folder):
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
    model = kmp.parallelize(job.build)()
    rank = kmp.runtime.of(model).worker_index
    history = fit(model, [keras.callbacks.CSVLogger(os.path.join(folder, "history.csv"))])
    written = sorted(set(writes))
    refused = {}
    for case, given in {
        "checkpoint_everywhere": [keras.callbacks.ModelCheckpoint(os.path.join(folder, "k.keras"))],
        "backup_on_process_0": ([keras.callbacks.BackupAndRestore(os.path.join(folder, "backup"))]
                                if rank == 0 else []),
    }.items():
        try:
            fit(model, given)
            refused[case] = "fit returned"
        except ValueError as err:
            refused[case] = str(err)
    after = fit(model, [ModelCheckpoint(os.path.join(folder, "best.keras"))]).history["loss"]
    return {"rank": rank, "writes": written, "history": history.history, "refused": refused,
            "after": after}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    shared, alone = tmp_path_factory.mktemp("shared"), tmp_path_factory.mktemp("alone")
    results = kmp.launch(on_each_process, num_workers=2, args=(str(shared),), timeout=200,
                         env=helpers.simulated_devices(1))
    import keras

    history = fit(job.build(), [keras.callbacks.CSVLogger(str(alone / "history.csv"))])
    return {"shared": shared, "alone": alone, "processes": results, "history": history.history}


def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_process_0_alone_writes_the_csv_as_one_process_writes_it(run):
    first, second = run["processes"]
    assert (first["rank"], second["rank"]) == (0, 1)
    assert first["writes"] == ["history.csv"] and second["writes"] == []
    got, want = rows(run["shared"] / "history.csv"), rows(run["alone"] / "history.csv")
    # Keras's CSVLogger adds a "val_" column for each key when fit has no validation ("NA")
    assert got[0] == want[0] == ["epoch", "loss", "val_loss"]
    assert len(got) == len(want) == job.EPOCHS + 1
    assert [row[2] for row in got[1:]] == [row[2] for row in want[1:]] == ["NA"] * job.EPOCHS
    np.testing.assert_allclose(np.array([r[:2] for r in got[1:]], float),
                               np.array([r[:2] for r in want[1:]], float), atol=1e-5)


def test_keras_checkpoints_stop_every_process_before_training_naming_the_drop_in(run):
    first, second = (p["refused"] for p in run["processes"])
    for rank, refused in enumerate((first, second)):
        assert "keras.callbacks.ModelCheckpoint -> kmp.callbacks.ModelCheckpoint" in \
            refused["checkpoint_everywhere"]
        assert f"Received (worker {rank})" in refused["checkpoint_everywhere"]
    assert "keras.callbacks.BackupAndRestore -> kmp.callbacks.BackupAndRestore" in \
        first["backup_on_process_0"]
    assert second["backup_on_process_0"].startswith("model.fit on several workers: worker(s) 0 "
                                                    "were given Keras's ModelCheckpoint")
    assert not (run["shared"] / "k.keras").exists() and not (run["shared"] / "backup").exists()
    assert run["processes"][0]["after"] == run["processes"][1]["after"]
    assert (run["shared"] / "best.keras").is_file()
