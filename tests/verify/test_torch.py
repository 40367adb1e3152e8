"""kmp-verify on the torch lane: `-n 2` is 2 processes (torch trains one device per
process) against one process.

The quickstart (which launches itself on 2 processes when started alone) is equal. The
cases built to differ on torch part and name their cause in one verification of several
fits (BatchNormalization, a train_step that sums over the process's rows, a metric no
process reduces, a Dropout drawing per process as the script says). kmp-verify's own runs
make the Dropout draw one device's numbers. A script that cannot be compared says why.
"""

from __future__ import annotations

import pytest

from tests.verify import helpers
from tests.verify.helpers import assert_cannot, assert_causes, verify_case, verify_cases

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(900)]

DIFFERING = ["batchnorm", "train_step", "metric", "dropout", "dropout_one_device"]


def test_the_quickstart_on_two_processes_is_equal_within_its_noise(tmp_path):
    report, text, seconds = helpers.quickstart(tmp_path, "--steps", "16")
    assert report["verdict"] == "equal" and report["processes"], text
    assert any(r["figure"] == "every process logs and holds the same" for r in report["rows"])
    print(f"quickstart, torch, 2 processes, 16 steps: {seconds:.0f} s")


def test_each_case_built_to_differ_names_its_cause():
    assert_causes(verify_cases(DIFFERING, random_layers="script"), DIFFERING)


def test_dropout_draws_one_devices_numbers_in_verify():
    report = verify_case("dropout")
    assert report.ok, report


def test_a_script_that_cannot_be_compared_says_why():
    report = verify_cases(["undecorated"], tolerance=1e-5)
    assert_cannot(report, "undecorated")
    assert_cannot(verify_cases(["unseeded"], tolerance=1e-5), "unseeded")
