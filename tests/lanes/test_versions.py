"""One Keras version policy on every lane (`compat._policy`): a too-old Keras refused naming
`keras>=3.10` before Keras's own code can fail, an unchecked one (keras-nightly) refused
naming `KMP_ALLOW_UNCHECKED_VERSIONS` unless it is set, then one warning per process.

Measured before, with real installs (JAX 0.10.2): keras-nightly 3.16.0.dev2026102704 on
JAX trained with 8 UserWarnings where TensorFlow refused; Keras 3.9.2 on JAX died in fit
with `AttributeError: module 'jax' has no attribute 'spmd_mode'` where TensorFlow refused
naming `keras>=3.10`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.compat import _policy

LANES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def policy(monkeypatch):
    """A process that has not warned yet, the switch unset."""
    monkeypatch.setattr(_policy, "_announced", [])
    monkeypatch.delenv(kmp.compat.ALLOW_UNCHECKED_ENV, raising=False)
    return monkeypatch


def test_a_keras_older_than_3_10_is_refused_naming_the_upgrade(policy, lane):
    import keras

    policy.setattr(keras, "__version__", "3.9.2")
    with pytest.raises(_policy.KerasTooOldError) as raised:
        kmp.compat.check_keras_for_distribution()
    message = str(raised.value)
    assert message.startswith("Keras 3.9.2 is older than the Keras keras_mgpu_plugins "
                              f"distributes on the {LANES[lane]} lane")
    assert 'pip install "keras>=3.10,<3.16"' in message


def test_an_unchecked_keras_is_refused_then_warned_once(policy, lane):
    import keras

    from keras_mgpu_plugins.compat import require

    policy.setattr(keras, "__version__", "3.16.0.dev2026102704")
    with pytest.raises(kmp.compat.UncheckedVersionError) as raised:
        kmp.compat.check_keras_for_distribution()
    assert str(raised.value).startswith("keras_mgpu_plugins was not checked with Keras "
                                        f"3.16.0.dev2026102704 on the {LANES[lane]} lane")
    assert "set KMP_ALLOW_UNCHECKED_VERSIONS=1 on every process" in str(raised.value)
    policy.setenv(kmp.compat.ALLOW_UNCHECKED_ENV, "1")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        kmp.compat.check_keras_for_distribution()
        kmp.compat.check_keras_for_distribution()
        assert require("async_safe")  # a private use outside its range: folded in the one
    assert len(said) == 1, [str(w.message) for w in said]
    assert str(said[0].message).startswith(
        "keras_mgpu_plugins was not checked with Keras 3.16.0.dev2026102704 (a pre-release")


def test_the_installed_keras_follows_the_policy(policy):
    """Keras as installed in this lane's environment (`.ci/run canary`: keras-nightly)."""
    version = _policy.keras_version()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        if _policy.checked(version):
            kmp.compat.check_keras_for_distribution()
        else:
            with pytest.raises(kmp.compat.UncheckedVersionError):
                kmp.compat.check_keras_for_distribution()
            policy.setenv(kmp.compat.ALLOW_UNCHECKED_ENV, "1")
            kmp.compat.check_keras_for_distribution()
    assert len(said) == (0 if _policy.checked(version) else 1)


def fake_keras(folder, version: str, distribution: str) -> str:
    """A `keras` package that fails when imported, installed as `distribution` (metadata)."""
    package = folder / "keras"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('this Keras was imported')\n")
    info = folder / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\n"
                                   f"Version: {version}\n")
    (info / "RECORD").write_text("keras/__init__.py,,\n")
    return str(folder)


@pytest.mark.parametrize("version, distribution, refusal", [
    ("3.9.2", "keras", "KerasTooOldError: Keras 3.9.2 is older"),
    ("3.16.0.dev2026102704", "keras-nightly", "UncheckedVersionError: keras_mgpu_plugins was "
                                              "not checked with Keras 3.16.0.dev2026102704"),
])
def test_a_worker_refuses_before_keras_is_imported(tmp_path, lane, version, distribution,
                                                   refusal):
    """`kmp-launch`'s workers and the runner check the version from the metadata first."""
    site = fake_keras(tmp_path, version, distribution)
    script = textwrap.dedent("""
        import sys
        from keras_mgpu_plugins.compat import _policy
        print(_policy.keras_version())
        try:
            _policy.check()
        except Exception as err:
            print(f"{type(err).__name__}: {err}")
        print("keras" in sys.modules)
        """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, ROOT]), "KERAS_BACKEND": lane}
    env.pop(kmp.compat.ALLOW_UNCHECKED_ENV, None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert lines[0] == version, done.stderr
    assert lines[1].startswith(refusal) and f"on the {LANES[lane]} lane" in lines[1]
    assert lines[2] == "False"  # decided without importing Keras
