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
def test_every_row_once_per_epoch_a_new_order_each_epoch(jax_env, mode, optimizer):
    first, second = kmp.launch(launched.shuffled_fit, num_workers=2, args=(mode, optimizer),
                               timeout=180)
    assert first["seeds"] == second["seeds"] and len(first["seeds"]) == 1
    rows, batch = launched.ROWS, launched.BATCH
    orders = []
    for (pass0, rows0), (pass1, rows1) in zip(first["fed"], second["fed"], strict=True):
        assert pass0 == pass1
        share0, share1 = np.array(rows0), np.array(rows1)
        # every global batch: process 0's share, then process 1's
        glued = np.concatenate([np.concatenate([share0[i:i + 4], share1[i:i + 4]])
                                for i in range(0, len(share0), 4)])
        assert sorted(glued.tolist()) == list(range(rows))  # each row once
        orders.append(glued)
        if mode == "batch":  # the batches keep their rows; only the order inside changes
            for start in range(0, rows, batch):
                assert sorted(glued[start:start + batch]) == list(range(start, min(rows, start + batch)))
    trained = orders[-launched.EPOCHS:]
    assert len({tuple(o) for o in trained}) == launched.EPOCHS  # a new order each epoch
    assert any(o.tolist() != list(range(rows)) for o in trained)
    assert first["weights"] == second["weights"] and first["history"] == second["history"]
    for got, want in zip(first["weights"], first["reference"], strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_epoch_order_is_a_permutation_that_depends_on_seed_and_pass():
    one = shuffle.epoch_order(20, 8, 5, 1, True)
    assert sorted(one) == list(range(20))
    assert one.tolist() != shuffle.epoch_order(20, 8, 5, 2, True).tolist()
    assert one.tolist() != shuffle.epoch_order(20, 8, 6, 1, True).tolist()
    assert one.tolist() == shuffle.epoch_order(20, 8, 5, 1, True).tolist()
    shares = [shuffle.process_rows(20, 8, 2, p, 5, 1, True) for p in range(2)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(20))
