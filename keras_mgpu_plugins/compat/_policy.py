"""The one Keras version policy of every lane (TensorFlow, JAX, torch).

kmp distributes Keras's own `fit` by changing it (the records of `compat._registry`) and by
reading its internals (`compat._private_uses`), each checked for a range of Keras versions.
Whether a job may distribute with the installed Keras is decided here, once, the same way
on every lane, before any of those changes is applied and before Keras's own code can fail:

- Keras older than `MIN_KERAS` (3.10): refused, naming `keras>=3.10` (what goes wrong
  there, where known: TensorFlow 3.7 sums gradients across replicas, 3.8 and 3.9 log other
  metrics; Keras 3.9's JAX backend calls `jax.spmd_mode`, which JAX 0.10 no longer has);
- a Keras kmp was not checked with (a pre-release, such as keras-nightly, or a release from
  `CHECKED_BELOW["keras"]` on): refused with `UncheckedVersionError` naming
  `KMP_ALLOW_UNCHECKED_VERSIONS`, unless it is set to 1: then one warning per process
  stands for every change and private use outside its checked range (which
  `python -m keras_mgpu_plugins.compat` lists one by one).

`check()` is called where a lane starts to distribute: TensorFlow's strategies
(`check_keras_for_distribution`), JAX's `jax.distributed` and distributions, torch's
process group and `@kmp.parallelize`, and the launcher's workers and the runner before the
script (`run.prepare`), where Keras is not imported yet: its version is then read from the
installed distribution's metadata (`keras`, or `keras-nightly`, whichever holds the module).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import warnings

from packaging.version import Version

from keras_mgpu_plugins.compat._checks import CHECKED_BELOW, version_checked
from keras_mgpu_plugins.compat._record import ALLOW_UNCHECKED_ENV
from keras_mgpu_plugins.errors import KerasTooOldError, UncheckedVersionError

#: First Keras release whose `fit` kmp distributes (measured with this package's 2-worker
#: tests on Keras 3.5, 3.7, 3.8, 3.9, 3.10 and 3.15 on TensorFlow; 3.9.2 on JAX 0.10).
MIN_KERAS = "3.10.0"
#: What `pip install` should ask for: the checked range, as pyproject.toml's requirement.
WANTED = f'"keras>=3.10,<{CHECKED_BELOW["keras"].rsplit(".", 1)[0]}"'
_LANES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}
#: What goes wrong with an older Keras, where it was measured: (lane, below, what).
_TOO_OLD = (
    ("tensorflow", "3.8.0", "sums gradients across replicas: N replicas train with N times "
                            "the learning rate (keras-team/keras#19891)"),
    ("tensorflow", "3.10.0", "logs metrics across workers that differ from one process's"),
    ("jax", "3.10.0", "calls jax.spmd_mode in fit, which newer JAX (0.10 measured) no longer "
                      "has: AttributeError inside Keras's JAX trainer"),
)
_announced: list[str] = []  # the Keras version the one warning was given for

__all__ = ["KerasTooOldError", "MIN_KERAS", "UncheckedVersionError", "allowed", "check",
           "checked", "folded", "keras_version", "lane"]


def keras_version() -> str | None:
    """The installed Keras's version: `keras.__version__` once imported, else the metadata
    of the distribution that holds the module `keras` (no import); `None` if none does."""
    if "keras" in sys.modules:
        return str(sys.modules["keras"].__version__)
    spec = importlib.util.find_spec("keras")
    if spec is None or spec.origin is None:
        return None
    for name in ("keras", "keras-nightly"):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        located = str(dist.locate_file(os.path.join("keras", "__init__.py")))
        if os.path.exists(located) and os.path.samefile(located, spec.origin):
            return dist.version
    return None


def lane() -> str:
    """The lane Keras runs on (its backend), read without importing Keras where it is not."""
    if "keras" in sys.modules:
        name = sys.modules["keras"].backend.backend()
    else:
        name = os.environ.get("KERAS_BACKEND") or "tensorflow"
    return _LANES.get(name, name)


def checked(version: str) -> bool:
    """Whether `version` is a Keras kmp was checked with (a release in the range)."""
    return version_checked(version, MIN_KERAS, CHECKED_BELOW["keras"])


def allowed() -> bool:
    return os.environ.get(ALLOW_UNCHECKED_ENV) == "1"


def check() -> None:
    """Raises where the installed Keras may not distribute; warns once where it is allowed.

    Raises:
        KerasTooOldError: Keras older than `MIN_KERAS`, naming `keras>=3.10`.
        UncheckedVersionError: A Keras kmp was not checked with, unless
            `KMP_ALLOW_UNCHECKED_VERSIONS=1`.
    """
    version = keras_version()
    if version is None or checked(version):
        return
    here = lane()
    if Version(version) < Version(MIN_KERAS):  # a 3.10.0 pre-release included
        known = [what for name, below, what in _TOO_OLD
                 if _LANES[name] == here and Version(version) < Version(below)]
        why = f" (on {here}, Keras {version} {known[0]})" if known else ""
        raise KerasTooOldError(
            f"Keras {version} is older than the Keras keras_mgpu_plugins distributes on the "
            f"{here} lane{why}: kmp needs Keras >= {MIN_KERAS} to train on several devices "
            f"or processes. pip install {WANTED}.")
    if not allowed():
        raise UncheckedVersionError(
            f"keras_mgpu_plugins was not checked with Keras {version} on the {here} lane "
            f"({_kind(version)}; checked: Keras >={MIN_KERAS},<{CHECKED_BELOW['keras']}). kmp "
            "changes Keras's fit to distribute it; on a version nobody ran its tests on, "
            "those changes may train differently from one device. Install a checked Keras "
            f"(pip install {WANTED}), or set {ALLOW_UNCHECKED_ENV}=1 on every process to "
            "train anyway and compare the results with one device yourself "
            "(python -m keras_mgpu_plugins.compat lists each change and its verdict).")
    announce(version)


def folded(library: str = "keras") -> bool:
    """Whether a note that `library` is outside a checked range is folded into the policy's
    one warning (an unchecked Keras: given then, once per process)."""
    if library != "keras":
        return False
    version = keras_version()
    if version is None or checked(version) or Version(version) < Version(MIN_KERAS):
        return False
    announce(version)
    return True


def announce(version: str) -> None:
    """The one warning of a process on an unchecked Keras (`KMP_ALLOW_UNCHECKED_VERSIONS`)."""
    if version in _announced:
        return
    _announced.append(version)
    switch = (f"{ALLOW_UNCHECKED_ENV}=1 is set" if allowed() else
              f"distributing is refused unless {ALLOW_UNCHECKED_ENV}=1")
    warnings.warn(
        f"keras_mgpu_plugins was not checked with Keras {version} ({_kind(version)}; checked: "
        f"Keras >={MIN_KERAS},<{CHECKED_BELOW['keras']}) and {switch}: kmp applies its "
        "changes where the code they fix is still there and uses Keras's internals where "
        "they are as it knows them (python -m keras_mgpu_plugins.compat lists each). If "
        "training differs from one device, please report it with these versions.",
        UserWarning, stacklevel=3)


def _kind(version: str) -> str:
    return "a pre-release" if Version(version).is_prerelease else "newer than checked"


def forget_for_tests() -> None:
    """Lets the next unchecked Keras warn again (tests only)."""
    _announced.clear()
