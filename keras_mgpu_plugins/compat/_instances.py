"""The per-instance patches in force: what each set on which object, so it can be undone.

A per-instance `Patch` (`per_instance=True`) sets attributes on one object (a
model kmp placed, its optimizer, a `History`). What it replaced is kept on the
object itself (`vars(obj)[KEY]`: no reference from here keeps the object
alive), and the object is remembered weakly, so `unpatch_keras()` can restore
every live one. Two patches that set one attribute on one object must be
applied in their declared order (`Patch.after`): the later one wraps the earlier.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from keras_mgpu_plugins.compat._record import Patch, must_wrap

#: Where an object keeps its entries: (patch name, attribute, what it replaced, what it set,
#: which application).
KEY = "_kmp_compat_patches"
_MISSING = object()  # the attribute was not set on the instance (the class's was used)
_objects: list[weakref.ref] = []
_serial = itertools.count()


def install_on(patch: Patch, obj: Any, args: tuple, by_name: dict[str, Patch]) -> None:
    """Applies `patch` to `obj` (after checking the order) and records what it replaced.

    Raises:
        RuntimeError: If a patch in force on `obj` sets one of the same attributes and
            `patch` does not declare (`after=`) that it wraps it.
    """
    entries = vars(obj).get(KEY, [])
    attributes = patch.attributes()
    for name, attribute, _, installed, _ in entries:
        if (attribute in attributes and vars(obj).get(attribute) is installed
                and name != patch.name and name in by_name
                and not must_wrap(patch, by_name[name], by_name)):
            raise RuntimeError(
                f"kmp.compat: {patch.name} would wrap {name} ({attribute} of a "
                f"{type(obj).__name__}), but the registry declares no such order: add "
                f"after=({name!r},) to {patch.name}, or apply it first.")
    before = {a: vars(obj).get(a, _MISSING) for a in attributes}
    patch.apply(obj, *args)
    serial = next(_serial)
    new = [(patch.name, a, before[a], vars(obj)[a], serial) for a in attributes
           if vars(obj).get(a, _MISSING) is not before[a]]
    if new:
        if KEY not in vars(obj):
            vars(obj)[KEY] = entries
            _objects[:] = [ref for ref in _objects if ref() is not None]
            _objects.append(weakref.ref(obj))
        entries.extend(new)


def applied_on(obj: Any) -> list[str]:
    """The per-instance patches in force on `obj`, in the order applied."""
    return list(dict.fromkeys(entry[0] for entry in vars(obj).get(KEY, [])))


def remove_from(name: str, obj: Any) -> None:
    """Undoes the last application of patch `name` on `obj` (nothing if none is in force).

    Raises:
        RuntimeError: If another patch wrapped what it set since.
    """
    entries = vars(obj).get(KEY, [])
    mine = [e for e in entries if e[0] == name]
    if not mine:
        return
    last = [e for e in mine if e[4] == mine[-1][4]]
    for _, attribute, _, installed, _ in last:
        if vars(obj).get(attribute) is not installed:
            raise RuntimeError(f"kmp.compat: cannot undo {name} on a {type(obj).__name__}: "
                               f"another patch wrapped its {attribute} since; undo that first.")
    for entry in reversed(last):
        _restore(obj, entry)
        entries.remove(entry)


def undo_all() -> None:
    """Restores every attribute a per-instance patch set, on every live object."""
    for ref in reversed(_objects):
        obj = ref()
        if obj is not None:
            for entry in reversed(vars(obj).pop(KEY, [])):
                _restore(obj, entry)
    _objects.clear()


def _restore(obj: Any, entry: tuple) -> None:
    _, attribute, previous, _, _ = entry
    if previous is _MISSING:
        vars(obj).pop(attribute, None)
    else:
        vars(obj)[attribute] = previous
