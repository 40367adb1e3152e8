"""`kmp.compat.report()` and the canary's record.

The report gives every patch its verdict on the installed versions (the decision setting
up a strategy takes, what its check finds, the names it misses) without applying any;
`python -m keras_mgpu_plugins.compat` prints it. The last canary run is recorded in
`compat._canary` and README.md alike, with a verdict for every patch.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import keras
import pytest
from packaging.version import Version

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins import compat
from keras_mgpu_plugins.compat import _canary, _names
from tests.versions import prerelease

ROOT = pathlib.Path(kmp.__file__).parent.parent


@pytest.fixture
def unpatched(monkeypatch):
    """Nothing applied; after the test, the suite's state (Keras as it was, then patched)."""
    compat.unpatch_keras()
    yield
    compat.unpatch_keras()
    monkeypatch.undo()
    compat.patch_keras()


def test_the_report_gives_every_patch_its_verdict_on_the_installed_versions(monkeypatch,
                                                                           unpatched):
    """What setting up a strategy would do (nothing applied yet), then what is in force."""
    monkeypatch.delenv(compat.ALLOW_UNCHECKED_ENV, raising=False)
    report = compat.report()
    assert [v.name for v in report.patches] == [p.name for p in compat.PATCHES]
    assert report.versions["keras"] == keras.__version__
    assert report.versions["backend"] == keras.backend.backend() == "tensorflow"
    assert report.allow_unchecked is False
    for patch in compat.PATCHES:
        verdict = report.verdict(patch.name)
        assert verdict.checked == patch.checked_range() and verdict.in_force is False
        assert verdict.canary == _canary.verdict(patch.name)
        if patch.lane() == "jax":
            assert verdict.decision == "not used on the tensorflow backend (the jax lane's)"
            continue
        assert verdict.code == "there" and verdict.missing == (), patch.name
        if not prerelease(patch.library):
            assert verdict.decision == "applies" and verdict.why == "", patch.name
        elif patch.changes_results:
            assert verdict.decision.startswith("REFUSED: UncheckedVersionError"), patch.name
        else:
            assert verdict.decision.startswith("applies outside its checked range"), patch.name
    names = dict(report.names)
    assert names["tensorflow trainer"] == _names.path_of("tensorflow trainer") is not None
    assert names["tensorflow trainer"].rsplit(".", 1)[1] == (
        "Trainer" if Version(keras.__version__) >= Version("3.16.0.dev0") else "TensorFlowTrainer")
    assert dict((n, p) for n, _, p in report.private_uses)["model_checkpoint_hooks"] == ()
    text = str(report)
    assert f"Keras {keras.__version__} (backend tensorflow)" in text
    for patch in compat.PATCHES:
        assert f"  {patch.name}: {report.verdict(patch.name).decision}" in text
    monkeypatch.setenv(compat.ALLOW_UNCHECKED_ENV, "1")
    applied = compat.patch_keras()
    after = compat.report()
    for patch in compat.PATCHES:
        verdict = after.verdict(patch.name)
        assert verdict.in_force is (patch.name in applied), patch.name
        if verdict.in_force:
            assert verdict.decision == ("in force outside its checked range"
                                        if prerelease(patch.library) else "in force"), patch.name
    assert "[in force]" in str(after)


def test_the_report_names_a_missing_name_and_what_setting_up_would_do(monkeypatch, unpatched):
    module = _names.resolve("tensorflow trainer module")
    for attribute in ("TensorFlowTrainer", "Trainer"):
        monkeypatch.delattr(module, attribute, raising=False)
    monkeypatch.delenv(compat.ALLOW_UNCHECKED_ENV, raising=False)
    report = compat.report()
    verdict = report.verdict("steps_per_execution_under_distribution")
    assert len(verdict.missing) == 1 and "'tensorflow trainer'" in verdict.missing[0]
    assert verdict.decision == ("REFUSED: UncheckedVersionError unless "
                                "KMP_ALLOW_UNCHECKED_VERSIONS=1")
    assert report.verdict("symbolic_build_per_replica_batch").code.startswith(
        "cannot tell (its check raised MissingNameError")
    assert report.verdict("multi_worker_scalar_log_reduce").missing == ()
    assert dict(report.names)["tensorflow trainer"] is None
    assert "  tensorflow trainer: MISSING" in str(report)
    monkeypatch.setenv(compat.ALLOW_UNCHECKED_ENV, "1")
    assert compat.report().verdict("steps_per_execution_under_distribution").decision == (
        "skipped (with one warning)")


def test_python_m_compat_prints_the_report():
    done = subprocess.run([sys.executable, "-m", "keras_mgpu_plugins.compat"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("keras_mgpu_plugins ")
    assert f"Keras {keras.__version__}" in done.stdout
    for patch in compat.PATCHES:
        assert f"\n  {patch.name}: " in done.stdout
    assert "\nPrivate API uses:\n" in done.stdout and "\nPrivate names:\n" in done.stdout


def test_the_canary_record_has_every_patch_and_is_the_readmes():
    assert set(_canary.VERDICTS) == {p.name for p in compat.PATCHES}
    assert {kind for kind, _ in _canary.VERDICTS.values()} <= set(_canary.VERDICT_KINDS)
    run = _canary.LAST_RUN
    assert Version(run.keras).is_prerelease and run.date[:4].isdigit()
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Tested versions"):]
    for value in (run.date, f"keras-nightly {run.keras}", run.tensorflow_subset, run.jax_subset,
                  f"torch {run.torch}", run.torch_subset):
        assert value in section, value
