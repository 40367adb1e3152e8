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


#: The end of kmp's one warning per private use on a version outside its checked range
#: ("... relies on private Keras API ... checked for Keras >=3.10.0,<3.16.0; Keras
#: 3.16.0.dev... still has it, so it is used.").
OUTSIDE_RANGE_NOTE = "still has it, so it is used."


#: The start of the version policy's one warning on an unchecked Keras (`compat._policy`),
#: which stands for the notes of Keras's private uses and patches.
UNCHECKED_KERAS_NOTE = "keras_mgpu_plugins was not checked with Keras"


def without_expected_notes(messages: list[str]) -> list[str]:
    """`messages` less kmp's outside-the-range notes where they are expected (a pre-release):
    tests asserting "no other warning than Keras's" keep asserting it there."""
    return [m for m in messages if not (prerelease() and (OUTSIDE_RANGE_NOTE in m
                                                          or UNCHECKED_KERAS_NOTE in m))]
