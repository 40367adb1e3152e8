"""kmp traces `fit`, `evaluate` and `predict`'s step functions no more often than plain Keras.

On the same data (a partial last batch, validation, a second `fit`; `tests/compilations.py`),
each side in a fresh process: 2 replicas of one process against the same `MirroredStrategy`
set up by hand, one device (`MirroredStrategy` of one device; no strategy). Plain Keras
cannot run `steps_per_execution` > 1 on 2 replicas (keras-team/keras#19246): there kmp's 2
replicas are held to what plain Keras traces on one device.
"""

from __future__ import annotations

import pytest

from tests.compilations import assert_no_more, in_fresh_process

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("case", ["two", "one_mirrored", "one"])
def test_kmp_traces_as_plain_keras(case, tmp_path):
    assert_no_more(in_fresh_process("kmp", case, 1, tmp_path),
                   in_fresh_process("plain", case, 1, tmp_path))


def test_steps_per_execution_on_two_replicas_traces_as_one_device(tmp_path):
    assert_no_more(in_fresh_process("kmp", "two", 4, tmp_path),
                   in_fresh_process("plain", "one", 4, tmp_path))
