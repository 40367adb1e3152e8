"""Fine-tuning (keras.io's transfer-learning recipe) on 2 workers trains as one process.

One launched job runs the recipe (`tests/transfer_learning_recipe.py`) four ways
(phase 2 with the guide's `Adam(1e-5)` or SGD with a schedule; phase 1 compiled
in the factory or, `require_compiled=False`, outside it), then once with Keras's
own `compile` (kmp's `compile_adopts_state_made_outside` undone): there the
`BinaryAccuracy()` made in the `compile(...)` call counts each worker's half of
the batch, so the workers log different accuracies.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests import transfer_learning_recipe as recipe

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(400)]

CASES = [("schedule", True), ("adam", True), ("schedule", False), ("adam", False)]
PATCH = "compile_adopts_state_made_outside"


def on_each_worker():
    from tests import transfer_learning_recipe as recipe

    runs = {case: recipe.run("auto", *case) for case in CASES}
    runs["without"] = recipe.run("auto", "schedule", True, without=PATCH)
    return runs


@pytest.fixture(scope="module")
def workers():
    return kmp.launch(on_each_worker, num_workers=2, timeout=360)


@pytest.mark.parametrize("case", CASES)
def test_the_fine_tuning_recipe_matches_one_process_on_both_workers(workers, case):
    one = recipe.run("default", *case)
    for got in (w[case] for w in workers):
        assert got["iterations"] == one["iterations"] == [8, 8]
        assert recipe.max_difference(got["weights"], one["weights"]) < 1e-5
        for mine, theirs in zip(got["histories"], one["histories"], strict=True):
            assert mine.keys() == theirs.keys() == {"loss", "binary_accuracy"}
            for key, values in theirs.items():
                np.testing.assert_allclose(mine[key], values, atol=1e-5, err_msg=key)
        assert got["same_optimizer"]
    assert workers[0][case]["histories"] == workers[1][case]["histories"]


def test_without_the_patch_each_worker_logs_its_own_accuracy(workers):
    """Keras as released: the metric made outside the scope is a plain variable per worker."""
    one = recipe.run("default", "schedule", True)
    chief, other = (w["without"]["histories"][1]["binary_accuracy"] for w in workers)
    assert chief != other
    assert max(abs(a - b) for a, b in zip(chief, one["histories"][1]["binary_accuracy"],
                                          strict=True)) > 0.01
