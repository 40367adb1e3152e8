"""Global arrays as a `keras.utils.PyDataset` of this process's part of every global batch.

The rows of each pass are in one order on every process (`shuffle` mode: none, or the
permutation Keras draws on one process, a new one each pass: `inputs.shuffle`); each global
batch of `batch` rows is cut by the backend's `Sharing` (`rows`, `deliver`). The order comes
from the global random state, which `kmp.callbacks.BackupAndRestore` records at each
epoch's start, so a resumed `fit` sees the rows in the order the uninterrupted one would
have.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_mgpu_plugins.inputs import shuffle


def global_batches(arrays: tuple, batch: int, mode: Any, sharing: Any) -> Any:
    """A `keras.utils.PyDataset` of this process's piece of every global batch of `arrays`
    (`(x, y, sample_weight)`, global, `None` where absent), the rows in one order per pass:
    `mode` is fit's `shuffle` (`False`: in order; `True`, `"batch"`: a permutation the
    processes share, a new one each pass)."""
    import keras

    total = int(keras.tree.flatten(arrays[0])[0].shape[0])
    present = tuple(a for a in arrays if a is not None)
    if mode:
        shuffle.require()

    class GlobalBatches(keras.utils.PyDataset):
        """This process's pieces of the global batches of one order of the rows per pass."""

        def __init__(self) -> None:
            super().__init__()
            self.order = np.arange(total)

        @property
        def num_batches(self) -> int:
            return -(-total // batch)

        def __len__(self) -> int:
            return self.num_batches

        def __getitem__(self, i: int) -> tuple:
            if i == 0:  # a new pass over the data (an epoch, or Keras's peek to build)
                sharing.start_pass()
                if mode:
                    self.order = shuffle.agreed(sharing.keras_order(total, batch, mode),
                                                sharing.runtime)
            positions = self.order[i * batch:(i + 1) * batch]
            rows = sharing.rows(positions)
            if not mode and len(rows) and rows[-1] - rows[0] + 1 == len(rows):
                rows = slice(int(rows[0]), int(rows[-1]) + 1)  # in order: a view, no copy
            taken = tuple(keras.tree.map_structure(lambda a: np.asarray(a)[rows], a)
                          for a in present)
            return sharing.deliver(taken, len(positions), sharing.span(len(positions)) is None)

    return GlobalBatches()
