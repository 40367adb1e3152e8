"""The fast tier (`tests/tiers.py`) names tests that exist, covers every lane's core promises,
and is what `python -m pytest` runs without a path; with a path, every test runs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiers

ROOT = Path(__file__).resolve().parents[2]


def _tests_in(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


@pytest.mark.parametrize("lane", ["tensorflow", "jax", "torch"])
def test_every_entry_names_a_file_and_test_that_exist(lane):
    for entry in tiers.FAST_TIER[lane]:
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        if name:
            assert name.split("[")[0] in _tests_in(path), entry


#: Per lane: against one device, chief-only checkpoints, one stop epoch, a resume from a
#: backup, the launcher's quiet quickstart, the documented installs.
PROMISES = {
    "tensorflow": ["matches_one_device", "same_weights_as_one_process", "chief_writes",
                   "same_epoch", "rerun_is_bit_exact", "test_quickstart_output", "install_docs"],
    "jax": ["test_parity.py", "alone_writes", "chiefs_epoch", "resumes_bit_exact",
            "quickstart", "install_docs"],
    "torch": ["test_parity.py", "alone_writes", "chiefs_epoch", "resumes_a_shuffled_fit_bit_exact",
              "quickstart", "install_docs"],
}


@pytest.mark.parametrize("lane", ["tensorflow", "jax", "torch"])
def test_each_lane_has_its_core_promises(lane):
    entries = " ".join(tiers.FAST_TIER[lane])
    for promise in PROMISES[lane]:
        assert promise in entries, (lane, promise)
    assert "conformance" not in entries


def test_matching_is_by_test_and_its_parameters_only():
    assert tiers.in_fast_tier("tests/torch/test_quickstart.py::test_the_quickstart_trains_on_"
                              "two_processes[kmp-launch]", "torch")
    assert not tiers.in_fast_tier("tests/torch/test_quickstart.py::test_the_quickstart_trains_"
                                  "on_two_processes[self-launched]", "torch")
    assert tiers.in_fast_tier("tests/unit/test_install_docs.py::test_x[a]", "jax")
    assert not tiers.in_fast_tier("tests/multi_worker/test_fit.py::test_same_weights_as_one_"
                                  "process_on_the_same_global_batches_too", "tensorflow")


def _collected(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_no_path_selects_the_fast_tier_and_a_path_selects_every_test():
    fast, every = _collected(), _collected("tests/unit/test_tiers.py")
    assert "deselected" in fast and "tests collected" in fast
    assert "deselected" not in every
