"""Which kind of Keras/TensorFlow the tests run on: a release CI checks, or a pre-release.

kmp's checked ranges never hold a pre-release (the canary's keras-nightly, `.ci/run canary`):
on one, a private use still there is used with one warning, and the patches apply where
their code is still there (the canary sets `KMP_ALLOW_UNCHECKED_VERSIONS=1`). Tests that
assert "the installed version is a checked one" assert the opposite there.
"""

from __future__ import annotations

from packaging.version import Version


def prerelease(library: str = "keras") -> bool:
    """Whether the installed `library` ("keras", "tensorflow") is a pre-release or nightly build."""
    from keras_mgpu_plugins.compat import _names

    return Version(_names.library_version(library)).is_prerelease
