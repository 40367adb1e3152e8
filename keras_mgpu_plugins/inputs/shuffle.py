"""`fit(shuffle=True)` on several processes: one shuffled global epoch, shared.

Keras shuffles each process's arrays on its own, so with kmp's row shares every
process would shuffle only its own rows (and with its own random state): the
global batches would be no shuffle of the global rows. Here every process holds
the same global arrays and, each pass, the same permutation of the global rows:
drawn from a seed the chief draws (`np.random`, so `keras.utils.set_random_seed`
makes it reproducible, as Keras's own shuffle) and broadcasts once per `fit`,
varied per pass over the data. Each process is fed its part of every global batch
of that permutation (`inputs.batches`), as a `keras.utils.PyDataset` that draws the
next permutation whenever Keras starts a pass over it (asks for batch 0: each epoch,
or each pass when `steps_per_epoch` spans epochs). The union of the processes'
batches is thus a shuffled global epoch, each row once.

`shuffle="batch"` is Keras's: the batches keep their order, the rows inside each
global batch are permuted.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def agreed_seed(runtime: Any) -> int:
    """A seed drawn by the chief (`np.random`), the same on every process (one broadcast)."""
    drawn = np.array([np.random.randint(0, 2**31 - 1)], np.int64)
    return int(runtime.broadcast(drawn)[0])


def epoch_order(total: int, batch: int, seed: int, epoch: int, mode: Any) -> np.ndarray:
    """The global rows of `epoch` in the order they are trained (every row once).

    `mode` is fit's `shuffle`: `True` permutes all rows, `"batch"` the rows of
    each global batch of `batch` rows, keeping the batches' order.
    """
    rng = np.random.default_rng([seed, epoch])
    if mode != "batch":
        return rng.permutation(total)
    return np.concatenate([start + rng.permutation(min(batch, total - start))
                           for start in range(0, total, batch)])


def process_rows(total: int, batch: int, processes: int, index: int, seed: int, epoch: int,
                 mode: Any) -> np.ndarray:
    """The global rows process `index` trains on in `epoch`, in order (even shares)."""
    order = epoch_order(total, batch, seed, epoch, mode)
    return order[share_rows(total, batch, processes, index)]


def share_rows(total: int, batch: int, processes: int, index: int) -> np.ndarray:
    """Rows of process `index`: `[p*b, (p+1)*b)` of every global batch of `batch` rows."""
    parts = []
    for start in range(0, total, batch):
        size = min(batch, total - start)
        share = size // processes
        parts.append(np.arange(start + index * share, start + (index + 1) * share))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
