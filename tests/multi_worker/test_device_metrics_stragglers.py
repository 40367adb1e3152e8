"""DeviceMetricsLogger's straggler report on 2 real TensorFlow workers (`kmp.launch`): worker
1's slower input is named "input", its slower host code "host", and with nothing injected no
worker is named in 5 runs (`tests/straggler_scenarios.py`; the JAX and torch lanes run the
same scenarios in `tests/jax/` and `tests/torch/`)."""

from __future__ import annotations

import pytest

import keras_mgpu_plugins as kmp
from tests import straggler_scenarios as scenarios

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def reports():
    return kmp.launch(scenarios.job, num_workers=2, timeout=500)


def test_every_scenario_names_the_right_worker_and_phase_and_no_false_alarm(reports):
    scenarios.check(reports)
