"""`inputs.arrays.fit_arguments` on several processes: a shuffled fit of arrays feeds the rows in
the order Keras draws them on one device (from NumPy's global state, which BackupAndRestore
records), and registers no order of its own (`_data_order`)."""

from __future__ import annotations

import keras
import numpy as np

from keras_mgpu_plugins import _data_order
from keras_mgpu_plugins.inputs import arrays
from keras_mgpu_plugins.inputs.sharing import Sharing
from keras_mgpu_plugins.runtime import Rank


class _TwoProcesses:
    """Process 0 of 2; its collectives answer as if the other process agreed."""

    spans_workers = True

    def rank(self) -> Rank:
        return Rank(0, 2, True)

    def all_gather(self, value: np.ndarray) -> np.ndarray:
        return np.stack([value, value])

    def broadcast(self, value: np.ndarray) -> np.ndarray:
        return value


class _Batches(keras.utils.PyDataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> tuple:
        return np.zeros((4, 3), "float32"), np.zeros((4, 1), "float32")


def _fit(x, y=None, shuffle=True) -> dict:
    arguments = {"x": x, "y": y, "batch_size": 4, "shuffle": shuffle, "sample_weight": None,
                 "validation_split": 0.0, "validation_data": None,
                 "validation_batch_size": None}
    arrays.fit_arguments(arguments, Sharing(_TwoProcesses()))
    return arguments


def test_a_shuffled_fit_of_arrays_feeds_numpys_order_and_registers_none():
    x = np.arange(8, dtype="float32")[:, None]
    fed = _fit(x, x.copy())["x"]
    assert _data_order.current() is None
    np.random.seed(5)
    order = np.random.permutation(8)  # what Keras's NumPy iterator draws at a pass's start
    np.random.seed(5)
    rows = [fed[i][0][:, 0].astype(int).tolist() for i in range(2)]
    assert rows == [order[0:2].tolist(), order[4:6].tolist()]  # process 0's half of each batch
    _fit(_Batches(), shuffle=False)
    assert _data_order.current() is None
