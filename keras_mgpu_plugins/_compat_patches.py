"""The Keras patches: the `Patch` record, the `PATCHES` table, `patch_keras` / `unpatch_keras`.

Each patch names the upstream issue it works around and the Keras (or, for a
TensorFlow bug, TensorFlow) versions it is known for (it is applied only there), and is tested by a real multi-worker
run that fails without it (`tests/multi_worker/test_fit.py`). The patches
themselves live in `_compat_trainer`, `_compat_loss_scale`, `_compat_fit`,
`_compat_optim`, `_compat_data` and `_compat_iterators`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any

from packaging.version import Version

from keras_mgpu_plugins._compat_checks import version_checked, version_predates
from keras_mgpu_plugins._compat_data import (
    numpy_function_aliases_outputs,
    patch_numpy_function_owned_outputs,
    patch_py_dataset_pool_sigterm,
    pool_initializer_keeps_sigterm,
)
from keras_mgpu_plugins._compat_fit import (
    accumulation_merges_inside_cond,
    compile_makes_loss_tracker_in_current_scope,
    jit_compiles_the_distributed_step,
    patch_compile_in_model_scope,
    patch_gradient_accumulation,
    patch_jit_compile,
)
from keras_mgpu_plugins._compat_input_check import (
    checks_input_every_step,
    patch_full_batch_executions,
)
from keras_mgpu_plugins._compat_iterators import (
    keeps_iterator_on_training_thread,
    patch_release_iterators_off_thread,
)
from keras_mgpu_plugins._compat_loss_scale import (
    loss_scale_takes_first_replica,
    patch_loss_scale_finiteness,
)
from keras_mgpu_plugins._compat_optim import clips_before_all_reduce, patch_clip_after_all_reduce
from keras_mgpu_plugins._compat_trainer import (
    multi_step_conds_the_step,
    patch_reduce_per_replica,
    patch_steps_per_execution,
    patch_symbolic_build,
    reduce_per_replica_uses_axis_0,
    symbolic_build_reduces_batch,
)

_lock = threading.Lock()
_LIBRARY_NAMES = {"keras": "Keras", "tensorflow": "TensorFlow"}
#: The patches in force: name -> the function undoing it.
_applied: dict[str, Any] = {}
_warned_patches: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Patch:
    """A workaround: what it fixes, where, and for which Keras versions.

    Attributes:
        name: Its name, as `patch_keras()` returns it.
        upstream: The upstream issue.
        min_version: First version of `library` with the code it fixes (read from
            the released sources); older ones do not have that code.
        max_version: First version nobody has checked (exclusive).
        apply: Applies it; returns a function that undoes it.
        present: Whether the installed library still has the code it fixes
            (`None` when its source cannot be read).
        library: Whose versions `min_version`/`max_version` are: "keras" or
            "tensorflow" (a TensorFlow bug that Keras's `fit` runs into).
        changes_results: Whether a run without it trains or logs other numbers
            than one device (True) rather than failing, hanging or running
            slower (False). Such a patch fails closed: on a version it was not
            checked for, or where its code cannot be confirmed, `patch_keras`
            raises `UncheckedVersionError` unless the user opts in
            (`ALLOW_UNCHECKED_ENV`).
    """

    name: str
    upstream: str
    min_version: str
    max_version: str  # exclusive: the first version not known to need it
    apply: Callable[[], Any]
    present: Callable[[], bool | None] = lambda: None
    library: str = "keras"
    changes_results: bool = True

    def installed_version(self) -> str:
        if self.library == "tensorflow":
            import tensorflow as tf

            return tf.__version__
        import keras

        return keras.__version__

    def applies_to(self, version: str) -> bool:
        """Whether `version` is one this patch was checked for (never a pre-release)."""
        return version_checked(version, self.min_version, self.max_version)

    def checked_range(self) -> str:
        return f"{_LIBRARY_NAMES[self.library]} >={self.min_version},<{self.max_version}"


# Versions read from the released sources: `_maybe_symbolic_build` first appears
# in 3.5.0; the multi-worker "mean" branch with axis=0 in 3.3.0 (before it,
# "auto" meant a sum with axis=None, which works). Older Keras is refused for distribution
# anyway (`check_keras_for_distribution`). Every patch below is run-tested on Keras 3.10 +
# TensorFlow 2.16 and Keras 3.15 + TensorFlow 2.21: CI runs on both pairs (README.md, "Tested
# versions") the tests that exercise each one and, for most, fail without it; those of the
# multi-worker-only patches (py_dataset_pool_default_sigterm, release_iterators_off_thread,
# full_batch_executions_skip_input_check: tests/multi_worker/test_fit_settings.py) run on the
# oldest pair by hand, not in CI (there release_iterators_off_thread's test passed 2 runs of
# 4: in the others no released iterator was destroyed within its 60 s wait, under a load
# average of ~5 on 2 cores; not root-caused). The 2-worker fit tests also passed by hand
# with Keras 3.10 on TensorFlow 2.17 to 2.19.
PATCHES: tuple[Patch, ...] = (
    Patch(
        name="symbolic_build_per_replica_batch",
        upstream="https://github.com/keras-team/keras/issues/20585",
        min_version="3.5.0",
        max_version="3.16.0",
        apply=patch_symbolic_build,
        present=symbolic_build_reduces_batch,
        changes_results=False,
    ),
    Patch(
        name="multi_worker_scalar_log_reduce",
        upstream="https://github.com/keras-team/keras/issues/20585",
        min_version="3.3.0",
        max_version="3.16.0",
        apply=patch_reduce_per_replica,
        present=reduce_per_replica_uses_axis_0,
        changes_results=False,
    ),
    # The tf.cond around each step of a tf.while_loop: from 3.7.0 (3.3-3.6 loop in Python
    # over single steps); still there in 3.15.
    Patch(
        name="steps_per_execution_under_distribution",
        upstream="https://github.com/keras-team/keras/issues/19246",
        min_version="3.7.0",
        max_version="3.16.0",
        apply=patch_steps_per_execution,
        present=multi_step_conds_the_step,
        changes_results=False,
    ),
    # _tf_apply takes the first replica's `finite`: in 3.0.0 already, still in 3.15. No
    # upstream issue found: the upstream field names the code.
    Patch(
        name="loss_scale_global_finiteness",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/optimizers/loss_scale_optimizer.py",
        min_version="3.0.0",
        max_version="3.16.0",
        apply=patch_loss_scale_finiteness,
        present=loss_scale_takes_first_replica,
    ),
    # Both run-tested on Keras 3.10 and 3.15; applied from the first Keras kmp distributes
    # with (MIN_KERAS_FOR_DISTRIBUTION). `jit_compile_per_replica` wraps whatever `_make_function`
    # is in force, so it comes after `steps_per_execution_under_distribution`.
    Patch(
        name="gradient_accumulation_under_distribution",
        upstream="https://github.com/keras-team/keras/issues/20582",
        min_version="3.10.0",
        max_version="3.16.0",
        apply=patch_gradient_accumulation,
        present=accumulation_merges_inside_cond,
        changes_results=False,
    ),
    # Wraps the accumulation patch's `_backend_apply_gradients` (it handles accumulation itself).
    # Clipping: no keras-team/keras issue found; tensorflow/tensorflow#33929 is the closest
    # (tf.keras refused clipping under a strategy for this reason). It also runs the EMA
    # overwrite's cond cross-replica (no upstream issue found). Run-tested on 3.10 and 3.15.
    Patch(
        name="clip_after_all_reduce",
        upstream="https://github.com/tensorflow/tensorflow/issues/33929",
        min_version="3.10.0",
        max_version="3.16.0",
        apply=patch_clip_after_all_reduce,
        present=clips_before_all_reduce,
    ),
    # No upstream issue found (TensorFlow's preemption notifier's SIGTERM handler, inherited by
    # Keras's forked PyDataset workers); the upstream field names the code. Keras 3.10, 3.15.
    Patch(
        name="py_dataset_pool_default_sigterm",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/data_adapters/py_dataset_adapter.py",
        min_version="3.10.0",
        max_version="3.16.0",
        apply=patch_py_dataset_pool_sigterm,
        present=pool_initializer_keeps_sigterm,
        changes_results=False,
    ),
    # No upstream issue found: destroying a used distributed iterator blocks the training
    # thread for 0.16-5 s (up to 15 s) per fit under MultiWorkerMirroredStrategy (5-10 ms on
    # another thread); the upstream field names the code that drops it there. Keras 3.10, 3.15.
    Patch(
        name="release_iterators_off_thread",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/epoch_iterator.py",
        min_version="3.10.0",
        max_version="3.16.0",
        apply=patch_release_iterators_off_thread,
        present=keeps_iterator_on_training_thread,
        changes_results=False,
    ),
    # No upstream issue found: TensorFlow's distributed iterators check across workers at
    # every fetch whether each still has input (one all-reduce per step), unless the dataset
    # is infinite; the upstream field names that code. Run-tested on TensorFlow 2.16 (Keras
    # 3.10) and 2.21 (Keras 3.15); `present` also checks the Keras side
    # (`TFEpochIterator._get_iterator`).
    Patch(
        name="full_batch_executions_skip_input_check",
        upstream="https://github.com/tensorflow/tensorflow/blob/v2.21.0/tensorflow/python/distribute/input_lib.py",
        min_version="2.16.0",
        max_version="2.22.0",
        apply=patch_full_batch_executions,
        present=checks_input_every_step,
        library="tensorflow",
        changes_results=False,
    ),
    # No upstream issue found: Keras's `compile` makes the loss tracker in the current scope;
    # outside the model's MultiWorkerMirroredStrategy each worker logs its own loss. Keras
    # 3.10 and 3.15.
    Patch(
        name="compile_in_model_strategy_scope",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/trainer.py",
        min_version="3.10.0",
        max_version="3.16.0",
        apply=patch_compile_in_model_scope,
        present=compile_makes_loss_tracker_in_current_scope,
    ),
    Patch(
        name="jit_compile_per_replica",
        upstream="https://github.com/keras-team/keras/issues/19005",
        min_version="3.10.0",
        max_version="3.16.0",
        apply=patch_jit_compile,
        present=jit_compiles_the_distributed_step,
        changes_results=False,
    ),
    # A TensorFlow bug (found by this package's fit-settings tests; no upstream issue found,
    # tensorflow/tensorflow#59729 is the closest: a CPU tensor made from a NumPy array shares
    # its memory). Run-tested on TensorFlow 2.16 and 2.21 (fails without it on both); applied
    # from the oldest TensorFlow this package supports while `FuncRegistry` still hands the
    # caller's arrays over.
    Patch(
        name="numpy_function_owned_outputs",
        upstream="https://github.com/tensorflow/tensorflow/issues/59729",
        min_version="2.16.0",
        max_version="2.22.0",
        apply=patch_numpy_function_owned_outputs,
        present=numpy_function_aliases_outputs,
        library="tensorflow",
    ),
)


#: First Keras release whose `fit` trains and logs under `tf.distribute` as one process
#: does, measured with this package's 2-worker tests (tests/multi_worker/test_fit.py) on
#: Keras 3.5, 3.7, 3.8, 3.9, 3.10 and 3.15. Before 3.8, gradients are summed across
#: replicas, so N replicas train with N times the learning rate (keras-team/keras#19891,
#: fixed by keras-team/keras#20609 in 3.8.0); 3.8 and 3.9 train right but log metrics
#: (loss, val_loss) that differ from one process's under MultiWorkerMirroredStrategy.
MIN_KERAS_FOR_DISTRIBUTION = "3.10.0"


def check_keras_for_distribution() -> None:
    """Raises if the installed Keras would train or log wrongly under a distributing strategy.

    Raises:
        RuntimeError: With Keras older than `MIN_KERAS_FOR_DISTRIBUTION` (TensorFlow
            backend), naming what goes wrong and the upgrade.
    """
    import keras

    version = keras.__version__
    if keras.backend.backend() != "tensorflow" or Version(version) >= Version(
        MIN_KERAS_FOR_DISTRIBUTION
    ):
        return
    what = ("sums gradients across replicas: N replicas train with N times the learning rate "
            "(keras-team/keras#19891)" if Version(version) < Version("3.8.0") else
            "logs metrics across workers that differ from one process's")
    raise RuntimeError(
        f"Keras {version} {what}. keras_mgpu_plugins needs Keras >= "
        f"{MIN_KERAS_FOR_DISTRIBUTION} to train on several devices or workers: "
        f"pip install 'keras>={MIN_KERAS_FOR_DISTRIBUTION}'."
    )


class UncheckedVersionError(RuntimeError):
    """A patch whose absence changes training results cannot be verified on these versions."""


#: Set to 1 to run with patches that change training results on Keras/TensorFlow versions
#: they were not checked for (applied where the code they fix is still there).
ALLOW_UNCHECKED_ENV = "KMP_ALLOW_UNCHECKED_VERSIONS"


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

    Returns:
        The names of the patches in force after the call.

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
        plan = [(patch, *_decide(patch)) for patch in PATCHES if patch.name not in _applied]
        refused = [(patch, why) for patch, action, why in plan if action == "refuse"]
        if refused:
            raise UncheckedVersionError(_refusal(refused))
        notes = []
        for patch, action, why in plan:
            if action == "apply":
                _applied[patch.name] = patch.apply()
            if why:
                notes.append(f"{patch.name} ({'applied' if action == 'apply' else 'not applied'}: "
                             f"{why})")
        if notes:
            _warn_once("kmp.compat: outside the versions these patches were checked for: "
                       + "; ".join(notes) + ". If distributed fit fails or differs from one "
                       "device, please report it with these versions.")
        return list(_applied)


def _decide(patch: Patch) -> tuple[str, str]:
    """What to do with `patch`: ("apply" | "skip" | "refuse", why, "" within the checked range)."""
    version = patch.installed_version()
    if version_predates(version, patch.min_version):
        return "skip", ""  # an older library lacks the code it fixes
    present = patch.present()
    library = _LIBRARY_NAMES[patch.library]
    if patch.applies_to(version) and present is not False:
        return "apply", ""
    state = {True: "still has the code it fixes", False: "no longer has the code it fixes",
             None: "its code cannot be read"}[present]
    why = f"{library} {version} {state}; checked for {patch.checked_range()}"
    if patch.changes_results and os.environ.get(ALLOW_UNCHECKED_ENV) != "1":
        return "refuse", why
    return ("apply" if present else "skip"), why


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


def _warn_once(message: str) -> None:
    import warnings

    if message not in _warned_patches:
        _warned_patches.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def unpatch_keras() -> None:
    """Undoes every applied patch (for tests that prove a patch is needed)."""
    with _lock:
        for name in reversed(list(_applied)):
            _applied.pop(name)()
