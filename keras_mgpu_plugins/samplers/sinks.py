"""Where every record of device metrics goes on the chief: a CSV file and TensorBoard."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from keras_mgpu_plugins.io import csv_rows

#: Columns written before the metric keys in the CSV file.
CSV_PREFIX = ("time_s", "epoch", "batch", "kind")


class RecordSinks:
    """The chief's files for every record: a CSV file and TensorBoard scalars, each optional.

    Args:
        csv_path: CSV file with one row per record, or `None`.
        log_dir: TensorBoard directory, or `None`.
        resumed: Where the run resumes (`CSVSink`).
    """

    def __init__(self, csv_path: str | None = None, log_dir: str | None = None,
                 resumed: Callable[[], tuple[int, int] | None] | None = None) -> None:
        self.csv = CSVSink(csv_path, resumed) if csv_path else None
        self.tensorboard = TensorBoardSink(log_dir) if log_dir else None

    def write(self, time_s: float, epoch: int, batch: int, kind: str, step: int,
              metrics: Mapping[str, float]) -> None:
        """One record: a CSV row (`batch` done in `epoch`) and scalars at global `step`."""
        if self.csv is not None:
            self.csv.write(time_s, epoch, batch, kind, metrics)
        if self.tensorboard is not None:
            self.tensorboard.write(step, metrics)

    def close(self) -> None:
        for sink in (self.csv, self.tensorboard):
            if sink is not None:
                sink.close()


class CSVSink:
    """Writes one row per record; the header is fixed by the first record.

    Args:
        path: The file, overwritten at the first row of a run; or, where `resumed()` (asked
            then) gives `(epoch, batch)`, where a `kmp.callbacks.BackupAndRestore` resumed
            the run: the rows before that point kept (the header's columns too), appended to.
        resumed: Where the run resumes, `None` where it does not.
    """

    def __init__(self, path: str,
                 resumed: Callable[[], tuple[int, int] | None] | None = None) -> None:
        self.path = os.fspath(path)
        self._resumed = resumed
        self._file: Any = None
        self._writer: Any = None
        self._keys: list[str] = []

    def write(self, time_s: float, epoch: int, batch: int, kind: str, metrics: Mapping[str, float]) -> None:
        if self._file is None:
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            header = self._keep_before(self._resumed() if self._resumed else None)
            mode = "a" if header else "w"
            self._file = open(self.path, mode, newline="", encoding="utf-8")  # noqa: SIM115
            self._writer = csv.writer(self._file)
            self._keys = header[len(CSV_PREFIX):] if header else list(metrics)
            if not header:
                self._writer.writerow([*CSV_PREFIX, *self._keys])
        values = [metrics.get(k, math.nan) for k in self._keys]
        self._writer.writerow([f"{time_s:.3f}", epoch, batch, kind, *(_fmt(v) for v in values)])
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _keep_before(self, at: tuple[int, int] | None) -> list[str] | None:
        """Resumed at `at` (epoch, batch): the file cut to its rows before it; its header."""
        if at is None:
            return None

        def before(row: dict) -> bool:
            epoch, batch = int(row["epoch"]), int(row["batch"])
            return epoch < at[0] or (epoch == at[0] and row["kind"] == "batch" and batch < at[1])

        def kept(rows: list[dict]) -> int:
            return next((i for i, row in enumerate(rows) if not before(row)), len(rows))

        header = csv_rows.keep_rows(self.path, ",", kept)
        return header if header and tuple(header[:len(CSV_PREFIX)]) == CSV_PREFIX else None


def _fmt(value: float) -> str:
    return "" if math.isnan(value) else repr(float(value))


class TensorBoardSink:
    """Writes each record as TensorBoard scalars at the global step.

    The event file is the backend's (`_backend.active().summary_writer`: on
    TensorFlow, `tf.summary.write` with the scalar plugin's metadata, so only
    TensorFlow, not the `tensorboard` package, is needed); backends without
    one raise, naming what to use instead.

    Args:
        log_dir: Directory of the event file.
    """

    def __init__(self, log_dir: str) -> None:
        from keras_mgpu_plugins import _backend

        self._writer = _backend.active().summary_writer(os.fspath(log_dir))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self._writer.write(step, metrics)  # NaN values are left out

    def close(self) -> None:
        self._writer.close()
