"""A `tf.data` input that reshuffles each iteration trains on 2 workers as on one process.

The 2-worker side of tests/multi_device/test_reshuffled_input.py: each worker makes the
iterators one process makes of its (auto-sharded) dataset, no more, no fewer, so each epoch
splits the order one process trains on.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests import fit_settings_scenarios as s
from tests.multi_device.test_reshuffled_input import reshuffled_run

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(300)]


def two_epochs_on_worker():
    return {"first step": reshuffled_run("multi_worker", 1, 1), "2 epochs": reshuffled_run("multi_worker", 2)}


def test_a_reshuffling_dataset_trains_on_2_workers_as_on_one_process():
    workers = kmp.launch(two_epochs_on_worker, num_workers=2, timeout=280)
    one = {"first step": reshuffled_run("default", 1, 1), "2 epochs": reshuffled_run("default", 2)}
    for worker in workers:
        for case, want in one.items():
            np.testing.assert_allclose(worker[case]["loss"], want["loss"], atol=1e-5, err_msg=case)
            s.assert_close(worker[case]["weights"], want["weights"], what=case)
