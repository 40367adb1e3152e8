"""`fit(shuffle=True)` (and `"batch"`) on 2 JAX processes: one permutation of the global
rows per pass, shared by both processes, each feeding its share of every global batch;
equal to one device trained on the same global orders. One process keeps Keras's shuffle."""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.inputs import shuffle
from tests.jax import helpers, launched

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(240)]


@pytest.fixture
def jax_env(monkeypatch):
    for key, value in helpers.environment().items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("mode, optimizer", [(True, "sgd"), (True, "adam"), ("batch", "sgd")])
def test_every_row_once_per_epoch_a_new_order_each_epoch_as_one_device(jax_env, mode, optimizer):
    """The orders are Keras's own (`np.random` as its NumPy iterator draws them): 2 processes
    end with the weights and History of Keras's `fit(shuffle=...)` on one device."""
    first, second = kmp.launch(launched.shuffled_fit, num_workers=2, args=(mode, optimizer),
                               timeout=180)
    assert first["orders"] == second["orders"]
    rows, batch = launched.ROWS, launched.BATCH
    trained = [np.array(o) for o in first["orders"][-launched.EPOCHS:]]
    for order in trained:
        assert sorted(order.tolist()) == list(range(rows))  # each row once
        if mode == "batch":  # the batches keep their rows; only the order inside changes
            for start in range(0, rows, batch):
                assert sorted(order[start:start + batch]) == list(range(start, min(rows, start + batch)))
    assert len({tuple(o) for o in trained}) == launched.EPOCHS  # a new order each epoch
    assert first["weights"] == second["weights"] and first["history"] == second["history"]
    for got, want in zip(first["weights"], first["reference"], strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    for key, values in first["reference_history"].items():
        np.testing.assert_allclose(first["history"][key], values, rtol=0, atol=1e-5)


def test_numpy_order_is_what_keras_numpy_iterator_draws():
    """`shuffle.numpy_order` draws as Keras's array adapter does, from NumPy's global state."""
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    for mode in (True, "batch"):
        np.random.seed(3)
        adapter = ArrayDataAdapter(np.arange(20), batch_size=8, shuffle=mode)
        keras_rows = np.concatenate([np.asarray(b[0] if isinstance(b, tuple) else b).reshape(-1)
                                     for b in adapter.get_numpy_iterator()])
        after_keras = np.random.randint(1 << 30)
        np.random.seed(3)
        mine = shuffle.numpy_order(20, 8, mode)
        assert mine.tolist() == keras_rows.tolist(), mode
        assert np.random.randint(1 << 30) == after_keras, mode  # the state advanced alike


def test_agreed_takes_the_chiefs_order_where_the_processes_drew_others():
    class Runtime:
        spans_workers = True

        def __init__(self, orders):
            self.orders = orders

        def all_gather(self, mine):
            import zlib

            return np.array([[zlib.crc32(np.asarray(o, np.int64).tobytes()), len(o)]
                             for o in self.orders], np.int64)

        def broadcast(self, value, root=0):
            return np.asarray(self.orders[root])

    same = Runtime([[2, 0, 1], [2, 0, 1]])
    assert shuffle.agreed(np.array([2, 0, 1]), same).tolist() == [2, 0, 1]
    other = Runtime([[2, 0, 1], [1, 2, 0]])
    assert shuffle.agreed(np.array([1, 2, 0]), other).tolist() == [2, 0, 1]
