"""kmp-verify on the TensorFlow lane: 2 simulated devices (and 2 processes) against one.

The quickstart is equal within its noise (the command, its JSON); each case of
`tests/verify/cases.py` built to differ is named by its cause; each script that cannot be
compared says why; random layers draw one device's numbers in kmp-verify's runs (and with
`@kmp.parallelize(random_layers="one_device")`), and per replica as the script says
otherwise."""

from __future__ import annotations

import pytest

from tests.verify import helpers
from tests.verify.helpers import assert_cannot, assert_cause, verify_case

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_quickstart_on_two_devices_is_equal_within_its_noise(tmp_path):
    report, text, seconds = helpers.quickstart(tmp_path)
    assert report["verdict"] == "equal" and report["steps"] == 32, text
    noise = {r["figure"]: r["noise"] for r in report["rows"]}
    assert noise["variables, after each step"] > 0, text  # the noise run measured something
    assert "EQUAL" in text and "evaluate loss" in text
    print(f"quickstart, TensorFlow, 2 devices: {seconds:.0f} s")


@pytest.mark.parametrize("case", ["batchnorm", "train_step", "weighted_loss", "metric",
                                  "mixed", "embedding"])
def test_each_case_built_to_differ_names_its_cause(case):
    assert_cause(verify_case(case), case)


def test_sync_batchnorm_is_equal():
    report = verify_case("sync_batchnorm")
    assert report.ok, report


def test_dropout_draws_one_devices_numbers_in_verify_and_differs_as_the_script_says():
    assert verify_case("dropout").ok
    assert_cause(verify_case("dropout", random_layers="script"), "dropout")


def test_a_random_layer_kmp_cannot_draw_as_one_device_is_compared_turned_off():
    report = verify_case("uncovered")
    assert report.ok, report
    assert any("shuffle_features" in n and "turned off" in n for n in report.notes), report


def test_random_layers_one_device_trains_as_one_device():
    report = verify_case("dropout_one_device", random_layers="script")
    assert report.ok, report


@pytest.mark.parametrize("case", sorted(helpers.cases.CANNOT))
def test_each_script_that_cannot_be_compared_says_why(case):
    assert_cannot(verify_case(case, tolerance=1e-5), case)


@pytest.mark.multi_worker
def test_two_processes_are_equal_and_alike():
    report = verify_case("plain", processes=True, tolerance=1e-5)
    assert report.ok and report.processes, report
    assert any(r["figure"] == "every process logs and holds the same" and r["difference"] == 0
               for r in report.rows), report
