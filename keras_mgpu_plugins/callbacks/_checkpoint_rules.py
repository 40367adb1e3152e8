"""The small rules `ModelCheckpoint` decides by, with no Keras import.

- `encode_monitored` / `agreed_logs` / `monitored_value`: the chief's monitored
  value travels to every worker as two float64 numbers, and each worker runs
  Keras's save decision on logs holding that value.

Whether a template model (`model=`) can receive the trained weights is
`io.snapshots.check_template`, beside the copy it guards (`copy_weights`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

_MISSING, _SCALAR, _OTHER = 0.0, 1.0, 2.0


def encode_monitored(value: Any) -> np.ndarray:
    """`[kind, value]` as float64, for broadcasting a monitored log value.

    `kind` is 0 when the value is missing, 1 for a real scalar, 2 otherwise
    (an array, which Keras does not compare).
    """
    if value is None:
        return np.array([_MISSING, 0.0])
    array = np.asarray(value)
    if array.ndim == 0 and array.dtype.kind in "biuf":
        return np.array([_SCALAR, float(array)])
    return np.array([_OTHER, 0.0])


def monitored_value(encoded: np.ndarray) -> float | None:
    """The scalar an `encode_monitored` pair holds, or `None` (missing or not a scalar)."""
    return float(encoded[1]) if float(encoded[0]) == _SCALAR else None


def agreed_logs(logs: Mapping[str, Any], monitor: str, chief: np.ndarray) -> dict[str, Any]:
    """`logs` with the chief's monitored value (as encoded by `encode_monitored`).

    Unchanged where this worker already holds the chief's value, so a single
    process sees exactly Keras's logs.
    """
    logs = dict(logs)
    kind, value = float(chief[0]), float(chief[1])
    local = logs.get(monitor)
    if kind == _MISSING:
        logs.pop(monitor, None)
    elif kind == _OTHER:
        if encode_monitored(local)[0] != _OTHER:  # keep Keras's "not a scalar" path
            logs[monitor] = np.array([value])
    elif not np.array_equal(encode_monitored(local), chief):
        logs[monitor] = value
    return logs

