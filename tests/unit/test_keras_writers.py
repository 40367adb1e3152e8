"""Keras's own file writers under several workers (`_keras_writers`), decided without training.

Two workers are simulated by two threads whose runtimes all-gather through a
barrier (the collectives of `Runtime`, in lockstep), so the multi-worker check
runs as on a real job: who raises, after how many collectives, with what message.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest

from keras_mgpu_plugins import _keras_writers, _same_callbacks
from keras_mgpu_plugins.callbacks import BackupAndRestore, ModelCheckpoint, ParallelModelCheckpoint
from keras_mgpu_plugins.runtime import Rank, Runtime


class ThreadWorker(Runtime):
    """Worker `index` of a job of threads: `_gather` meets the others at a barrier."""

    def __init__(self, index: int, world: dict) -> None:
        self.index, self.world = index, world

    def rank(self) -> Rank:
        return Rank(self.index, self.world["size"], self.index == 0)

    @property
    def spans_workers(self) -> bool:
        return True

    def _gather(self, wire: np.ndarray) -> np.ndarray:
        self.world["slots"][self.index] = wire
        self.world["barrier"].wait(timeout=10)
        gathered = np.stack(self.world["slots"])
        self.world["barrier"].wait(timeout=10)
        self.world["gathers"][self.index] += 1
        return gathered


def check_on_workers(*callbacks_per_worker: list) -> list:
    """Runs `_same_callbacks.check` on one thread per worker; each one's error (or None)."""
    size = len(callbacks_per_worker)
    world = {"size": size, "slots": [None] * size, "barrier": threading.Barrier(size),
             "gathers": [0] * size}
    errors: list = [None] * size

    def work(index: int) -> None:
        try:
            _same_callbacks.check(callbacks_per_worker[index], ThreadWorker(index, world), 4)
        except Exception as err:  # noqa: BLE001  (the test reads it)
            errors[index] = err

    threads = [threading.Thread(target=work, args=(i,)) for i in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a worker is still waiting: a hang"
    return [errors, world["gathers"]]


def test_csv_logger_and_tensorboard_are_given_to_the_chief_only(tmp_path):
    class MyLogger(keras.callbacks.CSVLogger):
        pass

    history, stop = keras.callbacks.History(), keras.callbacks.TerminateOnNaN()
    given = [keras.callbacks.CSVLogger(str(tmp_path / "a.csv")), history,
             keras.callbacks.TensorBoard(str(tmp_path / "tb")), MyLogger(str(tmp_path / "b")),
             stop, ModelCheckpoint(str(tmp_path / "m.keras"))]
    assert _keras_writers.for_this_worker(given, is_chief=True) == given
    assert _keras_writers.for_this_worker(given, is_chief=False) == [history, stop, given[-1]]


def test_refused_names_keras_checkpoints_and_their_user_subclasses_not_kmps(tmp_path):
    class Mine(keras.callbacks.ModelCheckpoint):
        pass

    path = str(tmp_path / "m.keras")
    assert _keras_writers.refused([
        keras.callbacks.BackupAndRestore(str(tmp_path / "b")), Mine(path),
        keras.callbacks.ModelCheckpoint(path), keras.callbacks.CSVLogger(path)]) == (
        "keras.callbacks.BackupAndRestore", "keras.callbacks.ModelCheckpoint",
        "keras.callbacks.ModelCheckpoint")
    assert _keras_writers.refused([ModelCheckpoint(path), ParallelModelCheckpoint(
        keras.Sequential(), path), BackupAndRestore(str(tmp_path / "b"))]) == ()


def test_a_keras_checkpoint_on_every_worker_raises_on_every_worker_naming_the_drop_in(tmp_path):
    errors, gathers = check_on_workers(
        *[[keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))] for _ in range(2)])
    for index, error in enumerate(errors):
        assert isinstance(error, ValueError), error
        message = str(error)
        assert message.startswith("model.fit on several workers (TensorFlow lane) was given "
                                  "keras.callbacks.ModelCheckpoint, which has no multi-worker "
                                  "logic"), message
        assert "keras.callbacks.ModelCheckpoint -> kmp.callbacks.ModelCheckpoint" in message
        assert f"worker(s) 0, 1). Received (worker {index}): callbacks=[" in message
    assert gathers == [1, 1]  # the one all-gather of the settings, nothing more


def test_a_keras_backup_on_the_chief_only_raises_on_both_workers_no_hang(tmp_path):
    """The tf.keras idiom `[...] if chief else []`: a second all-gather names who had one."""
    errors, gathers = check_on_workers(
        [keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))], [])
    assert "given keras.callbacks.BackupAndRestore" in str(errors[0])
    assert "keras.callbacks.BackupAndRestore -> kmp.callbacks.BackupAndRestore" in str(errors[0])
    assert str(errors[1]).startswith("model.fit on several workers: worker(s) 0 were given "
                                     "Keras's ModelCheckpoint or BackupAndRestore"), errors[1]
    assert "Received (worker 1): callbacks without them" in str(errors[1])
    assert gathers == [2, 2]


def test_kmp_drop_ins_and_keras_loggers_pass_the_check(tmp_path):
    errors, gathers = check_on_workers(
        [ModelCheckpoint(str(tmp_path / "m.keras")), keras.callbacks.CSVLogger(str(tmp_path / "h"))],
        [ModelCheckpoint(str(tmp_path / "m.keras"))])
    assert errors == [None, None] and gathers == [1, 1]


@pytest.mark.parametrize("holders", [[0], [1], [0, 1]])
def test_every_worker_raises_whoever_was_given_one(tmp_path, holders):
    errors, _ = check_on_workers(*[
        [keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))] if i in holders else []
        for i in range(2)])
    assert all(isinstance(e, ValueError) for e in errors), errors
    assert all(f"worker(s) {', '.join(map(str, holders))}" in str(e) for e in errors), errors
