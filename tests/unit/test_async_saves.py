"""`async_save=True`: the training thread only snapshots; the writer thread makes the files.

Every Python-level file creation and rename under the test folder is recorded
with the thread that made it (an audit hook: real writes, nothing replaced),
for `ModelCheckpoint` and `BackupAndRestore`. A synchronous save makes them on
the training thread; an asynchronous one on the writer thread only. Then the
files are loaded: they hold the weights of their save point.
"""

from __future__ import annotations

import os
import sys
import threading

import keras
import numpy as np
import pytest

from keras_mgpu_plugins.callbacks import BackupAndRestore, ModelCheckpoint

_RECORDING: list[tuple[str, str, str]] = []  # (thread, event, path) while a test listens
_FOLDER: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if not _FOLDER or event not in ("open", "os.rename"):
        return
    path = str(args[0]) if event == "open" else str(args[1])
    if not path.startswith(_FOLDER[0]) or ".kmp-write-test-" in path:  # the folder probe
        return
    if event == "open":
        mode, flags = args[1] or "", args[2] or 0
        if not (any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR)):
            return
    _RECORDING.append((threading.current_thread().name, event, path))


sys.addaudithook(_audit)


def fit(callbacks, epochs=3):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    weights = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: weights.append(model.get_weights()))
    model.fit(x, x[:, :2], batch_size=8, epochs=epochs, verbose=0, shuffle=False,
              callbacks=[*callbacks, record])
    return weights


@pytest.mark.slow  # a real fit
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_only_the_writer_thread_creates_files(tmp_path, async_save):
    _RECORDING.clear()
    _FOLDER[:] = [str(tmp_path)]
    try:
        weights = fit([
            ModelCheckpoint(str(tmp_path / "ckpt" / "{epoch}.keras"), async_save=async_save),
            BackupAndRestore(str(tmp_path / "backup"), delete_checkpoint=False,
                             async_save=async_save),
        ])
    finally:
        _FOLDER.clear()
    threads = {thread for thread, _, _ in _RECORDING}
    expected = "kmp-checkpoint-writer" if async_save else threading.main_thread().name
    assert threads == {expected}, _RECORDING
    renamed = sorted(os.path.relpath(p, tmp_path) for _, e, p in _RECORDING if e == "os.rename")
    assert renamed == sorted(
        [f"ckpt/{e}.keras" for e in (1, 2, 3)]
        + ["backup/latest.weights.h5", "backup/training_metadata.json"] * 3)
    for epoch in range(3):  # each file holds the weights of its save point
        saved = keras.saving.load_model(tmp_path / "ckpt" / f"{epoch + 1}.keras")
        for ours, theirs in zip(saved.get_weights(), weights[epoch], strict=True):
            np.testing.assert_array_equal(ours, theirs)
    restored = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    restored.load_weights(tmp_path / "backup" / "latest.weights.h5")
    for ours, theirs in zip(restored.get_weights(), weights[-1], strict=True):
        np.testing.assert_array_equal(ours, theirs)
