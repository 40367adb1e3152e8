"""Which Keras/TensorFlow versions a patch, or distributed training, is known to work on.

`_decide` is the one version decision every record of `compat._registry` goes
through: a results-changing patch fails closed outside its checked range, a patch
whose check raises cannot tell (the same path), and a patch that wraps a private name
the installed version lacks (`compat._names`) is refused naming it.
"""

from __future__ import annotations

import os

from packaging.version import Version

from keras_mgpu_plugins.compat import _names, _policy
from keras_mgpu_plugins.compat._checks import version_predates
from keras_mgpu_plugins.compat._record import ALLOW_UNCHECKED_ENV, LIBRARY_NAMES, Patch

#: First Keras release kmp distributes on every lane (`compat._policy`: measured on
#: TensorFlow with this package's 2-worker tests on Keras 3.5, 3.7, 3.8, 3.9, 3.10 and 3.15:
#: before 3.8 gradients are summed across replicas, keras-team/keras#19891, fixed by
#: keras-team/keras#20609; 3.8 and 3.9 log metrics that differ from one process's).
MIN_KERAS_FOR_DISTRIBUTION = _policy.MIN_KERAS


def check_keras_for_distribution() -> None:
    """The version policy of every lane (`compat._policy.check`), where kmp distributes.

    Raises:
        KerasTooOldError: Keras older than `MIN_KERAS_FOR_DISTRIBUTION` (a `RuntimeError`),
            naming what goes wrong there and the upgrade.
        UncheckedVersionError: A Keras kmp was not checked with, unless
            `KMP_ALLOW_UNCHECKED_VERSIONS=1`.
    """
    _policy.check()


def present(patch: Patch) -> tuple[bool | None, str]:
    """`patch.present()`, and why it cannot tell: a check that raises counts as `None`."""
    try:
        return patch.present(), ""
    except Exception as err:  # noqa: BLE001 - any failure of a check is "cannot tell"
        return None, f"its check raised {type(err).__name__}: {err}"


def _decide(patch: Patch) -> tuple[str, str]:
    """What to do with `patch`: ("apply" | "skip" | "refuse", why, "" within the checked range).

    A private name it wraps that the installed version lacks is refused (skipped with
    `ALLOW_UNCHECKED_ENV`): it cannot be applied, and nobody knows what Keras does there.
    """
    version = patch.installed_version()
    if version_predates(version, patch.min_version):
        return "skip", ""  # an older library lacks the code it fixes
    library = LIBRARY_NAMES[patch.library]
    allowed = os.environ.get(ALLOW_UNCHECKED_ENV) == "1"
    gone = _names.missing(*patch.targets())
    if gone:
        return ("skip" if allowed else "refuse"), f"{library} {version}: {' '.join(gone)}"
    found, raised = present(patch)
    if patch.applies_to(version) and found is not False and not raised:
        return "apply", ""
    state = raised or {True: "still has the code it fixes", False: "no longer has the code it "
                       "fixes", None: "its code cannot be read"}[found]
    why = f"{library} {version} {state}; checked for {patch.checked_range()}"
    if patch.changes_results and not allowed:
        return "refuse", why
    return ("apply" if found else "skip"), why


def _refusal(refused: list[tuple[Patch, str]]) -> str:
    rows = "\n".join(f"  - {patch.name} ({patch.upstream}): {why}" for patch, why in refused)
    ranges = " ".join(
        f"'{library}>={max((p.min_version for p, _ in refused if p.library == library), key=Version)},"
        f"<{min((p.max_version for p, _ in refused if p.library == library), key=Version)}'"
        for library in sorted({patch.library for patch, _ in refused}))
    return (
        "keras_mgpu_plugins cannot verify, on the installed versions, the patches without which "
        "distributed training gives other numbers than one device (each is checked for the "
        f"range named):\n{rows}\nInstall versions in the checked range (pip install {ranges}), "
        f"or set {ALLOW_UNCHECKED_ENV}=1 on every worker to apply them where the code they fix "
        "is still there, and compare the results with one device yourself."
    )
