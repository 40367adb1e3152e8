"""The checks that decide whether a backup can resume here (`callbacks._training_state`)."""

from __future__ import annotations

import pytest

from keras_mgpu_plugins import _data_order
from keras_mgpu_plugins.callbacks import _training_state as training
from keras_mgpu_plugins.io.backup_state import BackupMismatchError
from keras_mgpu_plugins.runtime import SingleProcess

WORLD = {"replicas": 2, "workers": 2, "steps": 6}


def test_other_batches_per_epoch_are_refused_naming_both():
    training.check_world(WORLD, 1, 1, 6, "/b")  # another replica count: the same batches
    with pytest.raises(BackupMismatchError, match="written by a fit with 6 batches per epoch "
                                                  r"\(on 2 replicas\); this fit has 12"):
        training.check_world(WORLD, 1, 1, 12, "/b")


def test_an_uneven_split_of_the_global_batch_is_refused_naming_n_m_and_the_batch():
    training.check_split([8.0, 8.0], SingleProcess(), WORLD, "/b")
    training.check_split(None, SingleProcess(), WORLD, "/b")  # not measured (JAX)

    class ThreeReplicas(SingleProcess):
        replicas_in_sync = 3

    with pytest.raises(BackupMismatchError) as refused:
        training.check_split([6.0, 5.0, 5.0], ThreeReplicas(), WORLD, "/b")
    assert ("written by 2 replicas (2 workers); here 3 replicas (1 workers) cannot split the "
            "global batch of 16 rows evenly") in str(refused.value)


class Order:
    def state(self):
        return {"seed": 1, "passes": 3, "rows": 10, "mode": "True"}

    def restore(self, state):
        self.restored = state


@pytest.fixture
def order():
    mine = Order()
    _data_order.register(mine)
    yield mine
    _data_order.register(None)


def test_the_data_order_is_given_back_where_kmp_feeds_and_refused_across_feeders(order):
    saved = {"data_order": order.state(), "world": WORLD}
    training.check_data_order(saved, "/b")
    training.set_data_order(saved["data_order"])
    assert order.restored == order.state()
    _data_order.register(None)
    with pytest.raises(BackupMismatchError, match="written by 2 processes that fed the rows in "
                                                  "kmp's shared shuffled order"):
        training.check_data_order(saved, "/b")
    _data_order.register(order)
    with pytest.raises(BackupMismatchError, match="written by one process"):
        training.check_data_order({"data_order": None, "world": {"workers": 1}}, "/b")
