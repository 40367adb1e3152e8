"""kmp-verify on the TensorFlow lane: 2 simulated devices (and 2 processes) against one.

The quickstart is equal within its noise (the command, its JSON). The cases of
`tests/verify/cases.py` built to differ each part and name their cause, in one
verification of several fits (a Dropout drawing per replica, as the script says, among
them; `random_layers="one_device"` in the script agrees). kmp-verify's own runs make random
layers draw one device's numbers (a layer drawing through `keras.random.shuffle` is
compared turned off, said). Each script that cannot be compared says why.
"""

from __future__ import annotations

import pytest

from tests.verify import helpers
from tests.verify.helpers import assert_cannot, assert_causes, verify_case, verify_cases

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DIFFERING = ["batchnorm", "train_step", "weighted_loss", "metric", "mixed", "embedding",
             "dropout", "dropout_one_device"]


def test_the_quickstart_on_two_devices_is_equal_within_its_noise(tmp_path):
    report, text, seconds = helpers.quickstart(tmp_path, "--steps", "16")
    assert report["verdict"] == "equal" and report["steps"] == 16, text
    noise = {r["figure"]: r["noise"] for r in report["rows"]}
    assert noise["variables, after each step"] > 0, text  # the noise run measured something
    assert "EQUAL" in text and "evaluate loss" in text
    print(f"quickstart, TensorFlow, 2 devices, 16 steps: {seconds:.0f} s")


def test_each_case_built_to_differ_names_its_cause():
    assert_causes(verify_cases(DIFFERING, random_layers="script"), DIFFERING)


def test_sync_batchnorm_and_random_layers_in_verify_are_equal():
    report = verify_cases(["sync_batchnorm", "dropout", "uncovered"])
    assert report.ok, report
    assert any("(drop)" in n and "one device's numbers" in n for n in report.notes), report
    assert any("shuffle_features" in n and "turned off" in n for n in report.notes), report


@pytest.mark.parametrize("case", ["no_fit", "undecorated"])
def test_a_script_that_cannot_be_compared_says_why(case):
    assert_cannot(verify_case(case, tolerance=1e-5), case)


def test_every_other_reason_is_named_at_once():
    report = verify_cases(["unseeded", "clock", "batch_grows"], tolerance=1e-5)
    for case in ("unseeded", "clock", "batch_grows"):
        assert_cannot(report, case)


@pytest.mark.multi_worker
def test_two_processes_are_equal_and_alike():
    report = verify_case("plain", processes=True, tolerance=1e-5)
    assert report.ok and report.processes, report
    assert any(r["figure"] == "every process logs and holds the same" and r["difference"] == 0
               for r in report.rows), report
