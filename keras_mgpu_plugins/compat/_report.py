"""`kmp.compat.report()`: every patch's verdict on the installed versions, for users and bug reports.

One call (also `python -m keras_mgpu_plugins.compat`) says, for the installed Keras,
TensorFlow and JAX: per patch of `PATCHES`, the range it was checked for, whether the
installed library still has the code it fixes (or cannot tell, and why), the private
names it wraps that are missing, what setting up a strategy would do with it (the
decision of `compat._versions`, the one `patch_keras()` takes), whether it is in force,
and what the last canary run (`compat._canary`) found; per private use, what its check
finds; per private name (`compat._names`), where it was found. Nothing is applied.
"""

from __future__ import annotations

import dataclasses
import os
import platform

from keras_mgpu_plugins.compat import _canary, _names
from keras_mgpu_plugins.compat._record import ALLOW_UNCHECKED_ENV, LIBRARY_NAMES, Patch

_DECISIONS = {
    ("apply", False): "applies",
    ("apply", True): "applies outside its checked range (with one warning)",
    ("skip", False): "not needed: this version predates the code it fixes",
    ("skip", True): "skipped (with one warning)",
    ("refuse", True): f"REFUSED: UncheckedVersionError unless {ALLOW_UNCHECKED_ENV}=1",
}


@dataclasses.dataclass(frozen=True)
class PatchVerdict:
    """What kmp makes of one patch on the installed versions.

    Attributes:
        name: The patch (`Patch.name`).
        checked: The range it was checked for ("Keras >=3.10.0,<3.16.0").
        installed: The installed version of its library (or "not installed").
        code: Whether that version still has the code it fixes: "there", "gone",
            "cannot tell" (with why), or "n/a".
        missing: The private names it wraps that the installed version lacks.
        decision: What setting up a distributing strategy does with it.
        why: The reason, where the version is outside its checked range.
        in_force: Whether it is applied in this process now.
        canary: What the last canary run recorded for it.
    """

    name: str
    checked: str
    installed: str
    code: str
    missing: tuple[str, ...]
    decision: str
    why: str
    in_force: bool
    canary: str


@dataclasses.dataclass(frozen=True)
class CompatReport:
    """`kmp.compat.report()`: `str()` (and the REPL) show it as text; fields for code.

    Attributes:
        versions: Installed versions by name (Python, kmp, Keras, its backend,
            TensorFlow, JAX; `None`: not installed).
        allow_unchecked: Whether `KMP_ALLOW_UNCHECKED_VERSIONS=1` is set.
        patches: One `PatchVerdict` per record of `PATCHES`.
        private_uses: `(name, checked range, problems)` per `PRIVATE_USES` entry.
        names: `(key, path found)` per private name of `compat._names` (`None`:
            missing; "-": not looked for, its library is not installed).
    """

    versions: dict[str, str | None]
    allow_unchecked: bool
    patches: tuple[PatchVerdict, ...]
    private_uses: tuple[tuple[str, str, tuple[str, ...]], ...]
    names: tuple[tuple[str, str | None], ...]

    def verdict(self, name: str) -> PatchVerdict:
        """The verdict of patch `name`."""
        return next(v for v in self.patches if v.name == name)

    def __str__(self) -> str:
        v = self.versions
        lines = [f"keras_mgpu_plugins {v['keras_mgpu_plugins']} on Python {v['python']}: "
                 f"Keras {v['keras']} (backend {v['backend']}), TensorFlow "
                 f"{v['tensorflow'] or 'not installed'}, JAX {v['jax'] or 'not installed'}; "
                 f"{ALLOW_UNCHECKED_ENV}={'1' if self.allow_unchecked else 'unset'}",
                 f"Last canary run: {_canary.LAST_RUN.summary()}", "", "Patches:"]
        for p in self.patches:
            lines.append(f"  {p.name}: {p.decision}{' [in force]' if p.in_force else ''}")
            lines.append(f"      checked for {p.checked}, installed {p.installed}; its code: "
                         f"{p.code}")
            lines.append(f"      last canary: {p.canary}")
            lines += [f"      missing: {m}" for m in p.missing]
            lines += [f"      why: {p.why}"] if p.why and not (p.missing or p.code.startswith(
                "there")) else []
        lines += ["", "Private API uses:"]
        lines += [f"  {name} ({span}): {'; '.join(problems) or 'ok'}"
                  for name, span, problems in self.private_uses]
        lines += ["", "Private names:"]
        lines += [f"  {key}: {path or 'MISSING'}" for key, path in self.names if path != "-"]
        lines += [f"  {key}: not looked for (its library is not installed)"
                  for key, path in self.names if path == "-"]
        return "\n".join(lines)

    __repr__ = __str__


def _version(library: str) -> str | None:
    try:
        return _names.library_version(library)
    except ImportError:
        return None


def _verdict(patch: Patch, backend: str, applied: set[str]) -> PatchVerdict:
    from keras_mgpu_plugins.compat import _versions

    installed = _version(patch.library)
    canary = _canary.verdict(patch.name)
    base = dict(name=patch.name, checked=patch.checked_range(), installed=installed or
                "not installed", in_force=patch.name in applied, canary=canary)
    if installed is None:
        return PatchVerdict(code="n/a", missing=(), decision="not used: "
                            f"{LIBRARY_NAMES[patch.library]} is not installed", why="", **base)
    if patch.lane() not in ("", backend):
        return PatchVerdict(code="n/a", missing=(), why="", decision=f"not used on the {backend} "
                            f"backend (the {patch.lane()} lane's)", **base)
    gone = tuple(_names.missing(*patch.targets()))
    if patch.name in applied:  # its check would read the patch's own code now
        why = "" if patch.applies_to(installed) else (
            f"{LIBRARY_NAMES[patch.library]} {installed} is outside its checked range")
        return PatchVerdict(code="there when it was applied", missing=gone, why=why,
                            decision="in force" + (" outside its checked range" * bool(why)),
                            **base)
    found, raised = _versions.present(patch)
    code = (f"cannot tell ({raised})" if raised else
            {True: "there", False: "gone", None: "cannot tell (source not readable)"}[found])
    action, why = _versions._decide(patch)
    return PatchVerdict(code=code, missing=gone, why=why,
                        decision=_DECISIONS[action, bool(why)], **base)


def report() -> CompatReport:
    """Every patch's verdict, every private use's check and every private name, on the installed versions.

    Applies nothing: it reads the registry's decision for each patch as setting up a
    distributing strategy would take it. Paste `str(kmp.compat.report())` (or the output
    of `python -m keras_mgpu_plugins.compat`) into a bug report.

    Returns:
        A `CompatReport`.

    Example:
        >>> print(kmp.compat.report())
        keras_mgpu_plugins 0.1.0 on Python 3.11.7: Keras 3.15.1 (backend tensorflow), ...
    """
    import keras

    from keras_mgpu_plugins._version import __version__
    from keras_mgpu_plugins.compat import _registry
    from keras_mgpu_plugins.compat._private_uses import PRIVATE_USES

    backend = keras.backend.backend()
    versions = {"python": platform.python_version(), "keras_mgpu_plugins": __version__,
                "keras": keras.__version__, "backend": backend,
                "tensorflow": _version("tensorflow"), "jax": _version("jax"),
                "torch": _version("torch")}
    applied = set(_registry._applied)
    uses = tuple((u.name, f"{_names.LIBRARIES[u.library]} >={u.min_version},<{u.max_version}",
                  ("not installed",) if not versions[u.library] else
                  (f"not used on the {backend} backend",) if u.backend not in ("", backend)
                  else tuple(u.problems())) for u in PRIVATE_USES)
    return CompatReport(
        versions=versions, allow_unchecked=os.environ.get(ALLOW_UNCHECKED_ENV) == "1",
        patches=tuple(_verdict(p, backend, applied) for p in _registry.PATCHES),
        private_uses=uses, names=tuple((n.key, _names.path_of(n.key) if _names.available(n.key) else "-")
                    for n in _names.NAMES))
