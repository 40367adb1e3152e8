"""`kmp.compat.report()` on the JAX lane: the TensorFlow lane's patches are said unused, JAX's
own are judged on the installed Keras and JAX, and no TensorFlow name is looked for where
TensorFlow is not installed (`python -m keras_mgpu_plugins.compat` does not fail there)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import keras

from keras_mgpu_plugins import compat
from tests.versions import prerelease


def test_the_report_on_jax_says_which_lane_each_patch_belongs_to(monkeypatch):
    monkeypatch.delenv(compat.ALLOW_UNCHECKED_ENV, raising=False)
    report = compat.report()
    assert report.versions["backend"] == "jax" and report.versions["jax"]
    for patch in compat.PATCHES:
        verdict = report.verdict(patch.name)
        if patch.lane() == "tensorflow":
            assert verdict.code == "n/a", patch.name
            assert verdict.decision in ("not used on the jax backend (the tensorflow lane's)",
                                        "not used: TensorFlow is not installed"), patch.name
        else:
            assert verdict.code == "there" and verdict.missing == (), patch.name
            assert verdict.decision == ("applies outside its checked range (with one warning)"
                                        if prerelease() else "applies"), patch.name
    uses = {name: problems for name, _, problems in report.private_uses}
    assert uses["jax_initialize_rng"] == () and uses["jax_backends_started"] == ()
    assert uses["model_parallel_graph"] == ("not used on the jax backend",)
    names = dict(report.names)
    assert names["jax xla_bridge"] == "jax._src.xla_bridge"
    if importlib.util.find_spec("tensorflow") is None:
        assert names["tensorflow trainer"] == "-"
        assert "tensorflow trainer: not looked for" in str(report)
    assert f"Keras {keras.__version__} (backend jax)" in str(report)


def test_python_m_compat_prints_the_report_on_jax():
    done = subprocess.run([sys.executable, "-m", "keras_mgpu_plugins.compat"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(backend jax)" in done.stdout
    assert "\n  jax_inputs_as_on_one_device: " in done.stdout
