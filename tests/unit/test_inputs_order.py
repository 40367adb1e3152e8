"""`inputs.arrays.fit_arguments` and the order BackupAndRestore records (`_data_order`): a fit
whose rows kmp does not shuffle itself leaves no former fit's order registered."""

from __future__ import annotations

import keras
import numpy as np

from keras_mgpu_plugins import _data_order
from keras_mgpu_plugins.inputs import arrays
from keras_mgpu_plugins.inputs.sharing import Sharing
from keras_mgpu_plugins.runtime import Rank


class _TwoProcesses:
    """Process 0 of 2; its collectives answer as if the other process agreed."""

    def rank(self) -> Rank:
        return Rank(0, 2, True)

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


def test_a_shuffled_fit_of_arrays_registers_its_order_and_the_next_fit_clears_it():
    x, y = np.zeros((8, 3), "float32"), np.zeros((8, 1), "float32")
    fed = _fit(x, y)["x"]
    assert _data_order.current() is fed and fed.state()["rows"] == 8
    _fit(_Batches(), shuffle=False)  # a PyDataset: its order is not kmp's arrays'
    assert _data_order.current() is None
    _fit(x, y)
    _fit(x, y, shuffle=False)
    assert _data_order.current() is None
