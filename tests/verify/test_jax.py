"""kmp-verify on the JAX lane: 2 simulated CPU devices, and 2 processes, against one.

The quickstart is equal. JAX's arrays are global, so what parts N replicas from one device
on the other lanes does not here (measured): BatchNormalization without sync_batchnorm
normalises over the global batch, and a Dropout draws over the global batch, one device's
numbers, even as the script says (`random_layers="script"`). Mixed precision differs
(each device rounds its share's float16 gradient) and is named. A script that cannot be
compared says why."""

from __future__ import annotations

import pytest

from tests.verify import helpers
from tests.verify.helpers import assert_cannot, verify_case, verify_cases

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_quickstart_on_two_devices_is_equal_within_its_noise(tmp_path):
    report, text, seconds = helpers.quickstart(tmp_path, "--steps", "16")
    assert report["verdict"] == "equal" and not report["processes"], text
    print(f"quickstart, JAX, 2 devices, 16 steps: {seconds:.0f} s")


@pytest.mark.multi_worker
def test_the_quickstart_on_two_processes_is_equal(tmp_path):
    report, text, _ = helpers.quickstart(tmp_path, "--processes", "--steps", "8")
    assert report["verdict"] == "equal" and report["processes"], text


def test_batchnorm_and_dropout_are_one_devices_already():
    report = verify_cases(["batchnorm", "dropout"], random_layers="script")
    assert report.ok, report
    assert all("noise run" not in n for n in report.notes), report


def test_mixed_precision_is_named():
    report = verify_case("mixed")
    assert report.verdict == "differ" and report.causes[0][0] == "loss_scale", report


def test_a_script_that_cannot_be_compared_says_why():
    assert_cannot(verify_case("no_fit", tolerance=1e-5), "no_fit")
    assert_cannot(verify_cases(["clock"], tolerance=1e-5), "clock")
