"""The fit-settings matrix on torch: 2 processes against one device on the same global batches.

What trains as one device does is compared (weights within 1e-5, half precision within its
rounding; History the same on both processes); what cannot is refused clearly, on both
processes, before training. One start of the two processes runs every scenario.
"""

from __future__ import annotations

import json

import keras
import pytest

from tests.torch import helpers, matrix

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(500)]

SCENARIOS = [
    ["mixed_precision", {"policy": "mixed_float16"}],
    ["mixed_precision", {"policy": "mixed_bfloat16"}],
    ["accumulation", {}],
    ["ema", {}],
    ["steps_per_execution", {}],
    ["torch_train_step", {}],
    ["two_backward_passes", {}],
    ["two_backward_passes", {"touched": True}],
    ["fit_twice", {}],
    ["recompiled", {}],
    ["jit_compile", {}],
    ["loss_sum_refused", {}],
]
#: Half precision rounds each step's activations: the processes' rows and one device's
#: round alike, their sums in another order.
HALF = 5e-4


def key(name: str, kwargs: dict) -> str:
    return f"{name}({json.dumps(kwargs, sort_keys=True)})"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    many = helpers.run_processes(folder, "tests.torch.cases:suite", {"scenarios": SCENARIOS})
    one = helpers.run_one(folder, "tests.torch.cases:suite", {"scenarios": SCENARIOS})
    return {key(n, k): (many[0][key(n, k)], many[1][key(n, k)], one[key(n, k)])
            for n, k in SCENARIOS}


def check(runs, name: str, kwargs: dict, tolerance: float = 1e-5) -> tuple:
    rank0, rank1, one = runs[key(name, kwargs)]
    assert helpers.max_diff(matrix.weights_of(rank0), matrix.weights_of(rank1)) == 0.0
    assert rank0["history"] == rank1["history"]
    assert helpers.max_diff(matrix.weights_of(rank0), matrix.weights_of(one)) < tolerance
    mine, theirs = matrix.history_of(rank0), matrix.history_of(one)
    assert set(mine) == set(theirs)
    for metric, values in theirs.items():
        assert max(abs(a - b) for a, b in zip(mine[metric], values, strict=True)) < (
            tolerance * 10), metric
    assert helpers.max_diff([rank0["predict"]], [one["predict"]]) < tolerance * 10
    return rank0, rank1, one


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_equals_one_device(runs, policy):
    rank0, _, _ = check(runs, "mixed_precision", {"policy": policy}, HALF)
    if policy == "mixed_float16":
        assert rank0["optimizer"] == "LossScaleOptimizer"  # gradients averaged before its check


@pytest.mark.parametrize("name", ["accumulation", "ema", "fit_twice", "recompiled"])
def test_optimizer_settings_and_repeated_fits_equal_one_device(runs, name):
    check(runs, name, {})


def test_fit_twice_from_initial_epoch(runs):
    rank0, _, one = runs[key("fit_twice", {})]
    assert rank0["first_history"] == runs[key("fit_twice", {})][1]["first_history"]
    assert len(matrix.history_of(rank0)["loss"]) == len(matrix.history_of(one)["loss"]) == 2


def test_a_torch_style_custom_train_step_equals_one_device(runs):
    """keras.io's recipe (zero_grad, backward, optimizer.apply; the metrics updated by hand)
    never calls scale_loss: kmp weights its gradients in apply instead."""
    check(runs, "torch_train_step", {})


@pytest.mark.parametrize("touched", [False, True])
def test_two_backward_passes_into_the_gradients_equal_one_device(runs, touched):
    """A step of the user's that accumulates two losses' gradients, without `scale_loss`, and
    (`touched`) scales them in place before `apply`: one device's update."""
    check(runs, "two_backward_passes", {"touched": True} if touched else {})


def test_steps_per_execution_as_on_one_device(runs):
    rank0, rank1, one = runs[key("steps_per_execution", {})]
    if "error_text" in one:  # Keras 3.15 refuses it on torch, on one device too
        assert rank0["error_text"] == rank1["error_text"] == one["error_text"]
        assert "steps_per_execution" in one["error_text"]
    else:
        check(runs, "steps_per_execution", {})


def test_jit_compile_and_a_summed_loss_are_refused_clearly(runs):
    for result in runs[key("jit_compile", {})][:2]:
        assert "jit_compile=True" in result["error_text"]
        assert "jit_compile=False" in result["error_text"]
    for result in runs[key("loss_sum_refused", {})][:2]:
        assert "reduction='sum'" in result["error_text"]
        assert "sum_over_batch_size" in result["error_text"]
    assert keras.backend.backend() == "torch"
