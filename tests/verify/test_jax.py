"""kmp-verify on the JAX lane: 2 simulated CPU devices, and 2 processes, against one.

The quickstart is equal; BatchNormalization without sync_batchnorm is named; Dropout is
equal even as the script says (JAX's arrays are global: a random layer draws over the
global batch, one device's numbers); a script that cannot be compared says why."""

from __future__ import annotations

import pytest

from tests.verify import helpers
from tests.verify.helpers import assert_cannot, assert_cause, verify_case

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_quickstart_on_two_devices_is_equal_within_its_noise(tmp_path):
    report, text, seconds = helpers.quickstart(tmp_path)
    assert report["verdict"] == "equal" and not report["processes"], text
    print(f"quickstart, JAX, 2 devices: {seconds:.0f} s")


@pytest.mark.multi_worker
def test_the_quickstart_on_two_processes_is_equal(tmp_path):
    report, text, _ = helpers.quickstart(tmp_path, "--processes", "--steps", "8")
    assert report["verdict"] == "equal" and report["processes"], text


def test_batchnorm_names_its_cause():
    assert_cause(verify_case("batchnorm"), "batchnorm")


def test_dropout_draws_over_the_global_batch_already():
    report = verify_case("dropout", random_layers="script")
    assert report.ok, report


@pytest.mark.parametrize("case", ["no_fit", "clock"])
def test_a_script_that_cannot_be_compared_says_why(case):
    assert_cannot(verify_case(case, tolerance=1e-5), case)
