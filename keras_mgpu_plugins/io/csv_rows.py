"""A CSV log file cut back to the rows a resumed run keeps, before it appends its own.

A run stopped (or killed) after its last backup went on writing rows that the resumed run
writes again; the rows from before the backup must stay. `keep_rows` rewrites a local file
with its header and the rows kept (atomically: a crash leaves the old file or the new one),
and returns the header, so that the resumed run appends under the same columns.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable

from keras_mgpu_plugins.io import atomic

Row = dict[str, str]


def keep_rows(path: str, separator: str, keep: Callable[[list[Row]], int]) -> list[str] | None:
    """Cuts the CSV file at `path` to its header and its first `keep(rows)` rows.

    Args:
        path: A local file (a remote or missing one is left as it is).
        separator: The file's delimiter.
        keep: Given the data rows (dicts keyed by the header), how many of the first to keep.

    Returns:
        The file's header (`None`: no file, a remote one, or an empty one).
    """
    if atomic.is_remote(path) or not os.path.isfile(path):
        return None
    with open(path, newline="", encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    if not lines:
        return None
    header, *rows = list(csv.reader(lines, delimiter=separator))
    kept = max(0, min(len(rows), keep([dict(zip(header, row, strict=False)) for row in rows])))
    if kept < len(rows):
        atomic.write_bytes_atomic(path, "".join(lines[:1 + kept]))
    return header


def last_run_from(rows: list[Row], epoch: int) -> int:
    """How many of `rows` (each with an `"epoch"`) to keep when a run resumes at `epoch`: all
    but the trailing ones the stopped run wrote from `epoch` on (ascending epochs, each at
    least `epoch`). Rows of earlier runs appended to the same file stay."""
    end = len(rows)
    while end > 0:
        value = _int(rows[end - 1].get("epoch"))
        if value is None or value < epoch:
            break
        if end < len(rows) and value >= _int(rows[end]["epoch"]):
            break  # not ascending: an earlier run's row
        end -= 1
    return end


def _int(text: str | None) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None
