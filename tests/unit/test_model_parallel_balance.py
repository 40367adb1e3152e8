"""Contiguous stage balancing and the pipeline bubble: pure numbers."""

from __future__ import annotations

import pytest

from keras_mgpu_plugins.model_parallel.balance import bubble_fraction, split_contiguous


def test_eight_equal_layers_on_four_devices_two_each_in_order():
    assert split_contiguous([1.0] * 8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_minimises_the_largest_stage_and_keeps_every_stage_non_empty():
    assert split_contiguous([10, 1, 1, 1], 3) == [0, 1, 2, 2]
    assert split_contiguous([1, 2, 3, 4, 5, 6], 2) == [0, 0, 0, 0, 1, 1]  # 10 | 11
    assert split_contiguous([4, 4, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1, 1]  # 4 | 8
    assert split_contiguous([5], 1) == [0]


def test_even_split_preferred_among_equal_maxima():
    # largest stage is 10 either way; [3, 3, 4] | [10] beats [3, 3] | [4, 10]? no: 14 > 10
    assert split_contiguous([3, 3, 4, 10], 2) == [0, 0, 0, 1]
    # equal maxima (6): 2+2+2 | 3+3 and 2+2 | 2+3+... -> the even one
    assert split_contiguous([2, 2, 2, 3, 3], 2) == [0, 0, 0, 1, 1]


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="More stages than layers: 4 devices for 3 layer calls"):
        split_contiguous([1, 1, 1], 4)


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_stage_count(bad):
    with pytest.raises(ValueError, match="n_stages"):
        split_contiguous([1, 1], bad)


def test_negative_cost_is_refused():
    with pytest.raises(ValueError, match="non-negative"):
        split_contiguous([1, -1], 1)


def test_bubble_fraction():
    assert bubble_fraction(1, 1) == 0
    assert bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(2, 4) == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="micro_batches"):
        bubble_fraction(2, 0)
