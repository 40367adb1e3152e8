"""Log files of a `fit` resumed by `kmp.callbacks.BackupAndRestore`: every epoch once.

Keras's `CSVLogger` (the patch `csv_logger_resumes`) and `DeviceMetricsLogger`'s CSV file
keep the rows written before the backup's point and append; rows the stopped run wrote
after it go. Pure parts (`io.csv_rows`) with numbers; Keras's `CSVLogger` in real fits,
listed before or after `BackupAndRestore`, stopped by SIGTERM mid-epoch, then resumed.
"""

from __future__ import annotations

import csv
import os
import signal

import keras
import numpy as np
import pytest

from keras_mgpu_plugins.callbacks import BackupAndRestore
from keras_mgpu_plugins.errors import TrainingStopped
from keras_mgpu_plugins.io import csv_rows
from keras_mgpu_plugins.samplers.sinks import CSVSink


def rows(*epochs):
    return [{"epoch": str(e)} for e in epochs]


@pytest.mark.parametrize("epochs, at, kept", [
    ((0, 1, 2), 2, 2),         # the stopped run logged epoch 2 after its backup: it goes
    ((0, 1), 2, 2),            # nothing after the backup
    ((0, 1, 2, 3), 1, 1),
    ((0, 1, 2, 0, 1), 1, 4),   # append=True: an earlier run's rows stay
    ((0, 1, 2, 0), 0, 3),
    ((), 0, 0),
])
def test_a_resumed_run_keeps_the_rows_before_its_epoch(epochs, at, kept):
    assert csv_rows.last_run_from(rows(*epochs), at) == kept


def test_keep_rows_cuts_the_file_and_returns_its_header(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("epoch;loss\r\n0;1.5\r\n1;1.2\r\n2;1.1\r\n", newline="")
    header = csv_rows.keep_rows(str(path), ";", lambda found: csv_rows.last_run_from(found, 2))
    assert header == ["epoch", "loss"]
    assert path.read_bytes() == b"epoch;loss\r\n0;1.5\r\n1;1.2\r\n"
    assert csv_rows.keep_rows(str(tmp_path / "none.csv"), ",", len) is None


def test_device_metrics_csv_resumed_keeps_the_rows_before_the_point(tmp_path):
    path = str(tmp_path / "metrics.csv")
    first = CSVSink(path)
    for epoch, batch, kind in [(0, 2, "batch"), (0, 4, "epoch"), (1, 2, "batch"),
                               (1, 4, "batch"), (1, 4, "epoch")]:
        first.write(1.0, epoch, batch, kind, {"a": 1.0, "b": 2.0})
    first.close()
    resumed = CSVSink(path, lambda: (1, 3))  # resumed in epoch 2 after 3 of its batches
    resumed.write(0.5, 1, 3, "batch", {"b": 4.0, "c": 5.0})  # another key: the file's header
    resumed.close()
    with open(path, newline="") as f:
        found = list(csv.reader(f))
    assert found == [["time_s", "epoch", "batch", "kind", "a", "b"],
                     ["1.000", "0", "2", "batch", "1.0", "2.0"],
                     ["1.000", "0", "4", "epoch", "1.0", "2.0"],
                     ["1.000", "1", "2", "batch", "1.0", "2.0"],
                     ["0.500", "1", "3", "batch", "", "4.0"]]


# --- Keras's CSVLogger in real fits ----------------------------------------------------


class Stop(keras.callbacks.Callback):
    """SIGTERM to this process after batch 2 of epoch 2 (the backup is of batch 3)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == (1, 2):
            os.kill(os.getpid(), signal.SIGTERM)


def fit(callbacks, epochs=3):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(24, 3)).astype("float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=epochs, verbose=0, callbacks=callbacks)


def logged(path):
    with open(path, newline="") as f:
        return [row[0] for row in csv.reader(f)][1:]


@pytest.mark.slow  # real fits
@pytest.mark.parametrize("first", [True, False], ids=["csv first", "csv last"])
@pytest.mark.parametrize("append", [False, True])
def test_keras_csv_logger_of_a_resumed_fit_holds_every_epoch_once(tmp_path, first, append):
    path, backup = str(tmp_path / "log.csv"), str(tmp_path / "backup")

    def callbacks(*more):
        logger = keras.callbacks.CSVLogger(path, append=append)
        listed = [BackupAndRestore(backup), *more]
        return [logger, *listed] if first else [*listed, logger]

    with pytest.raises(TrainingStopped):
        fit(callbacks(Stop()))
    assert logged(path) == ["0"]
    fit(callbacks())
    assert logged(path) == ["0", "1", "2"]
    fit(callbacks(), epochs=2)  # no backup left: Keras's own (overwrites, or appends)
    assert logged(path) == (["0", "1", "2", "0", "1"] if append else ["0", "1"])


@pytest.mark.slow  # real fits
def test_device_metrics_csv_of_a_resumed_fit_holds_every_epoch_once(tmp_path):
    from keras_mgpu_plugins.callbacks import DeviceMetricsLogger

    path, backup = str(tmp_path / "metrics.csv"), str(tmp_path / "backup")

    def callbacks(*more):
        return [DeviceMetricsLogger(csv_path=path, sample_interval=None, summary=False),
                BackupAndRestore(backup), *more]

    def rows():
        with open(path, newline="") as f:
            return [(row["epoch"], row["kind"]) for row in csv.DictReader(f)]

    with pytest.raises(TrainingStopped):
        fit(callbacks(Stop()))
    assert rows() == [("0", "epoch")]
    fit(callbacks())
    assert rows() == [("0", "epoch"), ("1", "epoch"), ("2", "epoch")]
