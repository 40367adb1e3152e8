"""Global arrays as a `keras.utils.PyDataset` of this process's part of every global batch.

The rows of each pass are in one order on every process (`shuffle` mode: none, a
permutation the processes share, a new one each pass: `inputs.shuffle`); each global
batch of `batch` rows is cut by the backend's `Sharing` (`rows`, `deliver`). A shuffled
order is recorded and restored by `kmp.callbacks.BackupAndRestore` (`_data_order`), so a
resumed `fit` sees the rows in the order the uninterrupted one would have.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_mgpu_plugins import _data_order
from keras_mgpu_plugins.inputs import shuffle


def global_batches(arrays: tuple, batch: int, mode: Any, sharing: Any) -> Any:
    """A `keras.utils.PyDataset` of this process's piece of every global batch of `arrays`
    (`(x, y, sample_weight)`, global, `None` where absent), the rows in one order per pass:
    `mode` is fit's `shuffle` (`False`: in order; `True`, `"batch"`: a permutation the
    processes share, a new one each pass)."""
    import keras

    total = int(keras.tree.flatten(arrays[0])[0].shape[0])
    present = tuple(a for a in arrays if a is not None)
    seed = shuffle.agreed_seed(sharing.runtime) if mode else None

    class GlobalBatches(keras.utils.PyDataset):
        """This process's pieces of the global batches of one order of the rows per pass."""

        def __init__(self) -> None:
            super().__init__()
            self.passes = 0  # batch 0 asked for: a new pass over the data (a new order)
            self.order = np.arange(total)

        @property
        def num_batches(self) -> int:
            return -(-total // batch)

        def __len__(self) -> int:
            return self.num_batches

        def state(self) -> dict:  # `_data_order`: resumed by BackupAndRestore
            return {"seed": seed, "passes": self.passes, "rows": total, "mode": str(mode)}

        def restore(self, state: dict) -> None:
            nonlocal seed
            if state.get("rows") == total and state.get("mode") == str(mode):
                seed, self.passes = int(state["seed"]), int(state["passes"])

        def __getitem__(self, i: int) -> tuple:
            if i == 0:
                self.passes += 1
                sharing.start_pass()
                if mode:
                    self.order = shuffle.epoch_order(total, batch, seed, self.passes, mode)
            positions = self.order[i * batch:(i + 1) * batch]
            rows = sharing.rows(positions)
            if not mode and len(rows) and rows[-1] - rows[0] + 1 == len(rows):
                rows = slice(int(rows[0]), int(rows[-1]) + 1)  # in order: a view, no copy
            taken = tuple(keras.tree.map_structure(lambda a: np.asarray(a)[rows], a)
                          for a in present)
            return sharing.deliver(taken, len(positions), sharing.span(len(positions)) is None)

    feeding = GlobalBatches()
    # a shuffled order BackupAndRestore records and restores (`_data_order`); fit's x last
    _data_order.register(feeding if mode else None)
    return feeding
