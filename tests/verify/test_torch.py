"""kmp-verify on the torch lane: `-n 2` is 2 processes (torch trains one device per
process) against one process.

The quickstart (which launches itself on 2 processes when started alone) is equal; the
cases built to differ on torch name their cause (BatchNormalization, a train_step that sums
over the process's rows, a metric no process reduces); Dropout draws one device's numbers
in kmp-verify's runs and per process as the script says otherwise; a script that cannot
be compared says why."""

from __future__ import annotations

import pytest

from tests.verify import helpers
from tests.verify.helpers import assert_cannot, assert_cause, verify_case

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(900)]


def test_the_quickstart_on_two_processes_is_equal_within_its_noise(tmp_path):
    report, text, seconds = helpers.quickstart(tmp_path)
    assert report["verdict"] == "equal" and report["processes"], text
    assert any(r["figure"] == "every process logs and holds the same" for r in report["rows"])
    print(f"quickstart, torch, 2 processes: {seconds:.0f} s")


@pytest.mark.parametrize("case", ["batchnorm", "train_step", "metric"])
def test_each_case_built_to_differ_names_its_cause(case):
    assert_cause(verify_case(case), case)


def test_dropout_draws_one_devices_numbers_in_verify_and_differs_as_the_script_says():
    assert verify_case("dropout").ok
    assert_cause(verify_case("dropout", random_layers="script"), "dropout")


@pytest.mark.parametrize("case", ["undecorated", "unseeded"])
def test_a_script_that_cannot_be_compared_says_why(case):
    assert_cannot(verify_case(case, tolerance=1e-5), case)
