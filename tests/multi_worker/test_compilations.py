"""On 2 workers kmp traces `fit`, `evaluate` and `predict`'s step functions no more often than
plain Keras does on one device (plain Keras cannot `fit` under MultiWorkerMirroredStrategy:
keras-team/keras#20585). The same data and phases as `tests/compilations.py`; plain Keras in a
fresh process."""

from __future__ import annotations

import pytest

import keras_mgpu_plugins as kmp
from tests.compilations import assert_no_more, build, in_fresh_process, traces

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(600)]

EXECUTIONS = (1, 4)  # steps_per_execution: Keras's own step (kmp's full batches), kmp's loop


def on_each_worker() -> dict:
    return {n: traces(kmp.parallelize(build)(n)) for n in EXECUTIONS}


@pytest.fixture(scope="module")
def workers():
    return kmp.launch(on_each_worker, num_workers=2, timeout=350)


@pytest.mark.parametrize("steps_per_execution", EXECUTIONS)
def test_two_workers_trace_as_one_device(workers, steps_per_execution, tmp_path):
    plain = in_fresh_process("plain", "one", steps_per_execution, tmp_path)
    for worker in workers:
        assert_no_more(worker[steps_per_execution], plain)
