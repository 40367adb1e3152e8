"""`fit(shuffle=True)` on several JAX processes: one shuffled global epoch, shared.

Keras shuffles each process's arrays on its own, so with kmp's row shares every
process would shuffle only its own rows (and with its own random state): the
global batches would be no shuffle of the global rows. Here every process holds
the same global arrays and, each epoch, the same permutation of the global rows:
drawn from a seed the chief draws (`np.random`, so `keras.utils.set_random_seed`
makes it reproducible, as Keras's own shuffle) and broadcasts once per `fit`,
varied per pass over the data. Process `p` is fed rows `[p*b, (p+1)*b)` of every global
batch of that permutation (`share_rows`), as a `keras.utils.PyDataset`
that draws the next permutation whenever Keras starts a pass over it (asks for
batch 0: each epoch, or each pass when `steps_per_epoch` spans epochs; Keras's
`on_epoch_end` is no pass boundary then); Keras assembles the processes'
shares into the global batch. The union of the processes' batches is
thus a shuffled global epoch, each row once.

`shuffle="batch"` is Keras's (JAX/numpy iterator): the batches keep their order,
the rows inside each global batch are permuted.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def agreed_seed() -> int:
    """A seed drawn by the chief (`np.random`), the same on every process (one broadcast)."""
    from keras_mgpu_plugins.backends.jax.runtime import JaxRuntime

    drawn = np.array([np.random.randint(0, 2**31 - 1)], np.int64)
    return int(JaxRuntime().broadcast(drawn)[0])


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
    """The global rows process `index` trains on in `epoch`, in order."""
    order = epoch_order(total, batch, seed, epoch, mode)
    return order[share_rows(total, batch, processes, index)]


def shuffled_shares(arrays: tuple, batch: int, mode: Any) -> Any:
    """A `keras.utils.PyDataset` of this process's share of every global batch of a new
    permutation each epoch. `arrays`: `(x, y, sample_weight)`, global, `None` where absent."""
    import jax
    import keras

    processes, index = jax.process_count(), jax.process_index()
    total = int(keras.tree.flatten(arrays[0])[0].shape[0])
    present = tuple(a for a in arrays if a is not None)
    share = batch // processes
    seed = agreed_seed()

    class SharedShuffle(keras.utils.PyDataset):
        """This process's shares of the global batches of one permutation per pass."""

        def __init__(self) -> None:
            super().__init__()
            self.passes = 0  # batch 0 asked for: a new pass over the data, a new permutation
            self.rows = np.zeros(0, np.int64)

        @property
        def num_batches(self) -> int:
            return -(-total // batch)

        def __len__(self) -> int:
            return self.num_batches

        def __getitem__(self, i: int) -> tuple:
            if i == 0:
                self.passes += 1
                self.rows = process_rows(total, batch, processes, index, seed, self.passes, mode)
            last = total % batch
            size = last // processes if last and i == total // batch else share
            rows = self.rows[i * share:i * share + size]
            return tuple(keras.tree.map_structure(lambda a: np.asarray(a)[rows], a)
                         for a in present)

    return SharedShuffle()


def share_rows(total: int, batch: int, processes: int, index: int) -> np.ndarray:
    """Rows of process `index`: `[p*b, (p+1)*b)` of every global batch of `batch` rows."""
    parts = []
    for start in range(0, total, batch):
        size = min(batch, total - start)
        share = size // processes
        parts.append(np.arange(start + index * share, start + (index + 1) * share))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
