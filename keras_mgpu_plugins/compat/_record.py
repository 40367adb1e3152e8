"""The `Patch` record: one change kmp makes to Keras/TensorFlow behaviour, and its order rules.

Every such change is a `Patch` in `compat._registry.PATCHES`: the workarounds of
upstream bugs (`kind="workaround"`, the table in `compat._table`, applied by
`patch_keras()`) and the changes kmp's own features install (`kind="feature"`,
`compat._features`, applied where the feature needs them through
`compat._registry.apply` / `apply_to`). Each names what it replaces (`wraps`),
and a patch that wraps an attribute another patch also wraps names that one in
`after` (it must wrap it): `order_problems` checks every pair, and applying
keeps that order whatever order the calls come in.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from keras_mgpu_plugins.compat import _names
from keras_mgpu_plugins.compat._checks import version_checked
from keras_mgpu_plugins.errors import UncheckedVersionError

__all__ = ["ALLOW_UNCHECKED_ENV", "LIBRARY_NAMES", "Patch", "UncheckedVersionError", "lazy",
           "must_wrap", "order_problems", "replace", "shared"]

LIBRARY_NAMES = {"keras": "Keras", "tensorflow": "TensorFlow"}


#: Set to 1 to run with patches that change training results on Keras/TensorFlow versions
#: they were not checked for (applied where the code they fix is still there).
ALLOW_UNCHECKED_ENV = "KMP_ALLOW_UNCHECKED_VERSIONS"


@dataclasses.dataclass(frozen=True)
class Patch:
    """A change to Keras/TensorFlow behaviour: what, why, where, for which versions, in what order.

    Attributes:
        name: Its name, as `patch_keras()` returns it.
        upstream: The upstream issue (or the upstream code it relies on).
        min_version: First version of `library` with the code it fixes (read from
            the released sources); older ones do not have that code.
        max_version: First version nobody has checked (exclusive).
        apply: Applies it; returns a function that undoes it. A feature's takes
            the arguments its caller gives `apply(name, *args)`; a per-instance
            one takes the object first and sets attributes on it (the registry
            undoes those).
        present: Whether the installed library still has the code it fixes, or
            relies on (`None` when its source cannot be read).
        library: Whose versions `min_version`/`max_version` are: "keras" or
            "tensorflow" (a TensorFlow bug that Keras's `fit` runs into).
        changes_results: Whether a run without it trains or logs other numbers
            than one device (True) rather than failing, hanging or running
            slower (False). Such a patch fails closed: on a version it was not
            checked for, or where its code cannot be confirmed, applying it
            raises `UncheckedVersionError` unless the user opts in
            (`ALLOW_UNCHECKED_ENV`).
        symptom: What a user sees without it, in the words they would search for.
        wraps: The attributes it replaces: `"<private name>.<attribute>"`, the name
            a key of `compat._names` (`"tensorflow trainer._make_function"`), or a
            public dotted path (`"keras.Model.fit"`); `per_instance`: the class,
            then the attribute it sets on an instance of it. Before applying, the
            registry checks that each is there (`compat._names.missing`).
        after: The patches it must wrap: applied before it where both are.
        kind: "workaround" (an upstream bug; `patch_keras()` applies it) or
            "feature" (installed by a kmp feature, at `when`).
        when: Where kmp applies it.
        per_instance: Set on single objects kmp made or was given (a model, its
            optimizer, a `History`), not on a Keras class or module.
        backend: The Keras backend whose lane installs it ("tensorflow", "jax"; ""
            for any); the workarounds are the TensorFlow backend's (`patch_keras()`).
    """

    name: str
    upstream: str
    min_version: str
    max_version: str  # exclusive: the first version not known to need it
    apply: Callable[..., Any]
    present: Callable[[], bool | None] = lambda: None
    library: str = "keras"
    changes_results: bool = True
    symptom: str = ""
    wraps: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    kind: str = "workaround"
    when: str = "kmp.compat.patch_keras(), at strategy creation"
    per_instance: bool = False
    backend: str = ""

    def lane(self) -> str:
        """The Keras backend it is used on ("" for any)."""
        return self.backend or ("tensorflow" if self.kind == "workaround" else "")

    def installed_version(self) -> str:
        return _names.library_version(self.library)

    def applies_to(self, version: str) -> bool:
        """Whether `version` is one this patch was checked for (never a pre-release)."""
        return version_checked(version, self.min_version, self.max_version)

    def checked_range(self) -> str:
        return f"{LIBRARY_NAMES[self.library]} >={self.min_version},<{self.max_version}"

    def targets(self) -> tuple[str, ...]:
        """The `wraps` entries that name a place in Keras/TensorFlow (checked before applying)."""
        return tuple(entry for entry in self.wraps if _names.checkable(entry))

    def attributes(self) -> tuple[str, ...]:
        """For a per-instance patch: the attribute names it sets on the object."""
        return tuple(path.rsplit(".", 1)[1] for path in self.wraps)


def lazy(module: str, name: str) -> Callable[..., Any]:
    """A function calling `module.name`, imported at the first call (no import cycle)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


def must_wrap(outer: Patch, inner: Patch, by_name: dict[str, Patch]) -> bool:
    """Whether `outer` declares (directly or through its `after` chain) that it wraps `inner`."""
    seen, todo = set(), list(outer.after)
    while todo:
        name = todo.pop()
        if name == inner.name:
            return True
        if name not in seen and name in by_name:
            seen.add(name)
            todo.extend(by_name[name].after)
    return False


def shared(a: Patch, b: Patch) -> set[str]:
    """What `a` and `b` both replace (per-instance and class patches never share)."""
    return set(a.wraps) & set(b.wraps) if a.per_instance == b.per_instance else set()


def order_problems(patches: Iterable[Patch]) -> list[str]:
    """Every pair that wraps one attribute without a declared order, or listed against it."""
    patches = list(patches)
    by_name = {p.name: p for p in patches}
    problems = [f"{p.name}: after={name!r} names no patch" for p in patches
                for name in p.after if name not in by_name]
    for i, inner in enumerate(patches):
        for outer in patches[i + 1:]:
            both = shared(inner, outer)
            if not both:
                continue
            if must_wrap(inner, outer, by_name):
                problems.append(f"{inner.name} wraps {outer.name} ({', '.join(sorted(both))}) "
                                "but comes first in the table")
            elif not must_wrap(outer, inner, by_name):
                problems.append(f"{inner.name} and {outer.name} both wrap "
                                f"{', '.join(sorted(both))}: neither names the other in after=")
    return problems


def replace(owner: Any, attribute: str, new: Any) -> Callable[[], None]:
    """Sets `owner.attribute = new`; returns the undo, which leaves `owner` exactly as it was."""
    had, old = attribute in vars(owner), vars(owner).get(attribute)
    setattr(owner, attribute, new)

    def undo() -> None:
        if had:
            setattr(owner, attribute, old)
        else:
            delattr(owner, attribute)

    return undo
