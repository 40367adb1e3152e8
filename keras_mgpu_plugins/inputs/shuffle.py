"""`fit(shuffle=True)` on several processes: one device's shuffled epoch, shared.

Keras shuffles each process's arrays on its own, so with kmp's row shares every
process would shuffle only its own rows: the global batches would be no shuffle of the
global rows. Here every process holds the same global arrays and, each pass, the same
permutation of the global rows: the one Keras's own `fit` draws on one process. Each
process draws it as Keras's input pipeline does on the active backend, from the same
global random state (`Sharing.keras_order`: NumPy's on JAX, torch's on torch; Python's
`random` for a `PyDataset`'s batch order), so a job seeded with
`keras.utils.set_random_seed` trains on the global batches one device trains on, epoch
after epoch, and leaves the random states where one device leaves them. The processes then
compare what they drew (one all-gather of a checksum): where they differ (a job that set
no seed, or seeded its processes differently) every process takes the chief's order (one
broadcast). Each process is fed its part of every global batch of that order
(`inputs.batches`), as a `keras.utils.PyDataset` that draws the next order whenever Keras
starts a pass over it (asks for batch 0). The union of the processes' batches is thus a
shuffled global epoch, each row once.

Because the order comes from the global random state at the epoch's start, a backup that
holds that state (`kmp.callbacks.BackupAndRestore`) resumes in the uninterrupted run's
order, on any number of processes.

`shuffle="batch"` is Keras's: the batches keep their order, the rows inside each
global batch are permuted.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import numpy as np


def require() -> None:
    """Raises unless the installed Keras draws its shuffles as kmp draws them (compat private
    use `keras_shuffle_draws`); called once per shuffled input on several processes."""
    from keras_mgpu_plugins.compat._private_uses import require as required

    required("keras_shuffle_draws")


def numpy_order(total: int, batch: int, mode: Any) -> np.ndarray:
    """A pass's rows as Keras's NumPy iterator of arrays draws them (JAX, and every backend
    that reads arrays through it): `np.random.permutation` of all rows at the pass's start,
    or (`"batch"`) of each batch's rows, batch after batch."""
    if mode != "batch":
        return np.random.permutation(total)
    return np.concatenate([start + np.random.permutation(min(batch, total - start))
                           for start in range(0, total, batch)]).astype(np.int64)


def batch_order(count: int) -> np.ndarray:
    """A `PyDataset`'s batches in the order Keras shuffles them (`random.shuffle`)."""
    indices = list(range(count))
    random.shuffle(indices)
    return np.asarray(indices, np.int64)


def agreed(order: np.ndarray, runtime: Any) -> np.ndarray:
    """`order` where every process drew the same, else the chief's, on every process.

    One all-gather of a checksum; one broadcast of the chief's order where they differ.
    Every process calls it at the same point (the start of a pass).
    """
    order = np.asarray(order, np.int64)
    if not runtime.spans_workers:
        return order
    mine = np.array([zlib.crc32(order.tobytes()), order.size], np.int64)
    if len({tuple(row) for row in runtime.all_gather(mine).tolist()}) == 1:
        return order
    return np.asarray(runtime.broadcast(order), np.int64)


def share_rows(total: int, batch: int, processes: int, index: int) -> np.ndarray:
    """Rows of process `index`: `[p*b, (p+1)*b)` of every global batch of `batch` rows."""
    parts = []
    for start in range(0, total, batch):
        size = min(batch, total - start)
        share = size // processes
        parts.append(np.arange(start + index * share, start + (index + 1) * share))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
