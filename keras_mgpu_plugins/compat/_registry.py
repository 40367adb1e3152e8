"""The registry of every change kmp makes to Keras/TensorFlow: `PATCHES`, applying and undoing.

`PATCHES` is one table: the workarounds of upstream bugs (`compat._table`,
applied together by `patch_keras()`) then the changes kmp's own features make
(`compat._features`, applied where each feature needs it: `apply(name, ...)`
for a Keras class or module, `apply_to(name, obj, ...)` for one object). Every
one goes through the same version decision (`_decide`: a results-changing
patch fails closed outside its checked range) and the same order rule (a patch
wrapping what another wraps declares it in `after`, and is applied outside it
whatever order the calls come in); `unpatch_keras()` undoes every one. The version
decision and the minimum Keras for distribution are `compat._versions`. The
record is `compat._record.Patch`; per-instance bookkeeping is `compat._instances`.
"""

from __future__ import annotations

import threading
from typing import Any

from keras_mgpu_plugins.compat import _instances, _policy
from keras_mgpu_plugins.compat._features import FEATURES
from keras_mgpu_plugins.compat._record import (
    ALLOW_UNCHECKED_ENV,
    LIBRARY_NAMES,
    Patch,
    UncheckedVersionError,
    must_wrap,
    shared,
)
from keras_mgpu_plugins.compat._table import WORKAROUNDS
from keras_mgpu_plugins.compat._versions import (
    MIN_KERAS_FOR_DISTRIBUTION,
    _decide,
    _refusal,
    check_keras_for_distribution,
)

__all__ = [
    "ALLOW_UNCHECKED_ENV", "MIN_KERAS_FOR_DISTRIBUTION", "PATCHES", "Patch",
    "UncheckedVersionError", "apply", "apply_to", "check_keras_for_distribution",
    "patch_keras", "patch_one", "remove", "remove_from", "unpatch_keras",
]

_lock = threading.RLock()
_LIBRARY_NAMES = LIBRARY_NAMES
#: The class/module patches in force, in the order applied: name -> the function undoing it.
_applied: dict[str, Any] = {}
#: The arguments each was applied with (to apply it again when one must go inside it).
_args: dict[str, tuple] = {}
_warned_patches: set[str] = set()

#: Every change kmp makes to Keras/TensorFlow behaviour, inner patches before the ones
#: wrapping them (`Patch.after`; `compat._record.order_problems` checks it).
PATCHES: tuple[Patch, ...] = WORKAROUNDS + FEATURES
_FEATURE_NAMES = frozenset(patch.name for patch in FEATURES)
#: Every record kmp declares, by name. The order (`after`) is read from these, so that a
#: table narrowed to fewer patches (a test proving one is needed) keeps the declared order.
_DECLARED = {patch.name: patch for patch in PATCHES}


def _by_name() -> dict[str, Patch]:
    """The records in force by name: the table's, over every declared one."""
    return {**_DECLARED, **{patch.name: patch for patch in PATCHES}}


def patch_keras() -> list[str]:
    """Applies the Keras (and TensorFlow) workarounds known for the installed versions. Idempotent.

    Only the TensorFlow backend is patched; other backends are left untouched.
    Keras older than `MIN_KERAS_FOR_DISTRIBUTION` is refused. A patch applies
    from its `min_version` (an older Keras, or TensorFlow for a TensorFlow
    patch, lacks the code it fixes) while the installed one still has that code
    (`Patch.present`). On a version it was not checked for (newer, or any
    pre-release), or where its code cannot be confirmed:

    - a patch whose absence changes training results (`changes_results`) is
      refused with `UncheckedVersionError`, naming it, the versions and the
      checked range, unless `KMP_ALLOW_UNCHECKED_VERSIONS=1` is set; then it
      applies where its code is still there;
    - any other patch applies where its code is still there, else is skipped.

    What was applied or skipped outside the checked ranges is said in one
    warning per process.

    Only the workarounds (`kind="workaround"`) are applied here; the changes
    kmp's features make are applied where those features need them.

    Returns:
        The names of the workarounds in force after the call.

    Raises:
        RuntimeError: Keras older than `MIN_KERAS_FOR_DISTRIBUTION`.
        UncheckedVersionError: As above.

    Example:
        >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()
        >>> kmp.compat.patch_keras()
        ['symbolic_build_per_replica_batch', 'multi_worker_scalar_log_reduce', ...]
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return []
    check_keras_for_distribution()
    with _lock:
        _apply_all([patch for patch in PATCHES
                    if patch.kind == "workaround" and patch.name not in _applied])
        return [name for name in _applied if name not in _FEATURE_NAMES]


def patch_one(name: str) -> bool:
    """Applies the patch `name` alone, as `patch_keras` would; whether it is in force after.

    For the patches kmp also applies on one device (`sum_duplicate_sparse_gradient_rows`):
    no Keras version floor beyond the patch's own.

    Raises:
        UncheckedVersionError: As `patch_keras`, for this patch.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return False
    return apply(name)


def apply(name: str, *args: Any) -> bool:
    """Applies the class/module patch `name` (with `args`) through the version decision.

    Idempotent: a patch in force is left as it is. A patch declared to wrap one
    already in force (`after`) is applied outside it; one that such a patch in
    force must wrap goes inside it (those are undone and applied again).

    Returns:
        Whether it is in force after the call (`False`: skipped on this version).

    Raises:
        UncheckedVersionError: As `patch_keras`, for this patch.
        KeyError: For a name that is no patch.
    """
    patch = _record(name)
    if patch is None:
        return False
    with _lock:
        _apply_all([patch] if name not in _applied else [], args)
        return name in _applied


def apply_to(name: str, obj: Any, *args: Any) -> bool:
    """Applies the per-instance patch `name` to `obj` (with `args`), as `apply` decides.

    Returns:
        Whether it was applied (`False`: skipped on this version).

    Raises:
        UncheckedVersionError: As `patch_keras`, for this patch.
        RuntimeError: If a patch in force on `obj` sets the same attribute and this one
            does not declare that it wraps it.
    """
    patch = _record(name)
    if patch is None:
        return False
    with _lock:
        _apply_all([patch], args, obj=obj)
        return name in _instances.applied_on(obj)


def remove(name: str) -> None:
    """Undoes the class/module patch `name` (nothing if it is not in force).

    Raises:
        RuntimeError: If a patch applied after it wraps what it replaced.
    """
    by_name = _by_name()
    with _lock:
        if name not in _applied:
            return
        later = list(_applied)[list(_applied).index(name) + 1:]
        outer = [n for n in later if n in by_name and name in by_name
                 and shared(by_name[n], by_name[name])]
        if outer:
            raise RuntimeError(f"kmp.compat: cannot undo {name} alone: {', '.join(outer)} "
                               "wrap what it replaced; undo them first (unpatch_keras()).")
        _applied.pop(name)()
        _args.pop(name, None)


def remove_from(name: str, obj: Any) -> None:
    """Undoes the last application of the per-instance patch `name` on `obj`."""
    with _lock:
        _instances.remove_from(name, obj)


def _record(name: str) -> Patch | None:
    """The table's record `name`; `None` for a declared one left out of the table."""
    for patch in PATCHES:
        if patch.name == name:
            return patch
    if name in _DECLARED:
        return None
    raise KeyError(f"kmp.compat has no patch named {name!r}; known: "
                   f"{', '.join(p.name for p in PATCHES)}")


def _install(patch: Patch, args: tuple) -> None:
    """Applies `patch` inside every patch in force declared to wrap it; under `_lock`."""
    by_name = _by_name()
    names = list(_applied)
    sharing = [n for n in names if n in by_name and shared(by_name[n], patch)]
    outer = [n for n in sharing if must_wrap(by_name[n], patch, by_name)]
    undeclared = [n for n in sharing if n not in outer and not must_wrap(patch, by_name[n], by_name)]
    if undeclared:
        raise RuntimeError(f"kmp.compat: {patch.name} and {', '.join(undeclared)} wrap the same "
                           "attribute but the registry declares no order (Patch.after).")
    redo = names[min(names.index(n) for n in outer):] if outer else []
    for n in reversed(redo):
        _applied.pop(n)()
    _applied[patch.name], _args[patch.name] = patch.apply(*args), args
    for n in redo:
        _applied[n] = by_name[n].apply(*_args.get(n, ()))


def _apply_all(patches: list[Patch], args: tuple = (), obj: Any = None) -> None:
    """Decides for each of `patches`, raises for any refused, else applies; under `_lock`."""
    plan = [(patch, *_decide(patch)) for patch in patches]
    refused = [(patch, why) for patch, action, why in plan if action == "refuse"]
    if refused:
        raise UncheckedVersionError(_refusal(refused))
    notes = []
    for patch, action, why in plan:
        if action == "apply" and patch.per_instance:
            _instances.install_on(patch, obj, args, _by_name())
        elif action == "apply":
            _install(patch, args)
        if why and not (patch.library == "keras" and _policy.folded()):
            notes.append(f"{patch.name} ({'applied' if action == 'apply' else 'not applied'}: "
                         f"{why})")
    if notes:
        _warn_once("kmp.compat: outside the versions these patches were checked for: "
                   + "; ".join(notes) + ". If distributed fit fails or differs from one "
                   "device, please report it with these versions.")


def _warn_once(message: str) -> None:
    import warnings

    if message not in _warned_patches:
        _warned_patches.add(message)
        warnings.warn(message, UserWarning, stacklevel=4)


def unpatch_keras() -> None:
    """Undoes every patch in force, per-instance ones on live objects included.

    For tests that prove a patch is needed: Keras's classes and modules, and every
    object a per-instance patch was applied to, hold what they held before.
    """
    with _lock:
        _instances.undo_all()
        for name in reversed(list(_applied)):
            _applied.pop(name)()
        _args.clear()
