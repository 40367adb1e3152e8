"""Every Keras/TensorFlow workaround and every use of private Keras API, in one place.

This module is the public entry point (`kmp.compat`); it re-exports what lives
in private modules, each under ~300 lines:

- `_compat_patches`: the registry. `PATCHES` is ONE table of every change kmp
  makes to Keras/TensorFlow behaviour (`_compat_record.Patch`): the workarounds
  of upstream bugs (`_compat_table`, `kind="workaround"`, applied together by
  `patch_keras()`) and the wrappers kmp's own features install (`_compat_features`,
  `kind="feature"`, applied where each feature needs it: `apply(name, ...)` for a
  Keras class or module, `apply_to(name, obj, ...)` for one object). Each names
  the upstream issue (or the code it relies on), the symptom without it, what it
  replaces (`wraps`), the patch it must wrap where two replace one method (`after`;
  `order_problems` checks the table, applying keeps the order whatever order the
  calls come in), the versions it was checked for and a `present()` check. A patch
  whose absence changes training results (`Patch.changes_results`) fails closed
  outside its checked range (newer versions, any pre-release): applying it raises
  `UncheckedVersionError` unless `KMP_ALLOW_UNCHECKED_VERSIONS=1`.
  `unpatch_keras()` undoes every one (per-instance ones: `_compat_instances`).
  `symptom_index()` renders the "symptom → patch" table of docs/troubleshooting.md.
  The workarounds themselves are in `_compat_trainer` (symbolic build, scalar log
  reduce, `steps_per_execution`; also `distributing`, `refuse_unsupported_settings`),
  `_compat_loss_scale`, `_compat_fit` (`jit_compile=True`,
  `gradient_accumulation_steps`, `compile` again outside the strategy's scope),
  `_compat_optim` (clipping after the all-reduce, the EMA overwrite), `_compat_data`
  (forked `PyDataset` workers on several workers; TensorFlow writing into a
  generator's arrays on several devices), `_compat_iterators` (used distributed
  iterators destroyed off the training thread), `_compat_input_check` (no per-step
  input check across workers for executions of full batches) and
  `_compat_custom_step`. `_compat_env` is the one workaround set through the
  environment rather than by patching: glibc's malloc top pad for the workers kmp
  starts, applied by the launcher (`launch._tuning`).
  Users who build their own `tf.distribute.MultiWorkerMirroredStrategy` call
  `kmp.compat.patch_keras()` once; `parallelize` does it for them.
- `_compat_private`: private API. The rest of the package touches no Keras
  internal: it calls the small helpers there (`set_initial_epoch`,
  `loss_tracker_rows`, ...), through this module. `_compat_graph` holds the
  helpers over Keras's functional graph that model parallelism uses.
- `_keras_private`: the private-API registry. Each helper calls `require(name)` for the
  `PrivateUse` it relies on (Keras's or TensorFlow's: `PrivateUse.library`), which
  records the versions it is known for
  and checks (once per Keras version: the result is cached) that it is still
  there (`PRIVATE_USES`, `KERAS_PRIVATE_HOOKS`); the checks are in
  `_compat_checks`. Outside that range a use either has a documented fallback
  or raises a `RuntimeError` naming what changed; `tests/unit/test_compat.py`
  tests each one.

Tests that replace a patch-machinery name (`PATCHES`, `_warned_patches`,
`_applied`) do so in `_compat_patches`, where `patch_keras` reads it; callers
that go through `compat.patch_keras` (`parallelize`, `get_strategy`) see a
replacement of `compat.patch_keras` itself.
"""

from __future__ import annotations

from keras_mgpu_plugins._compat_index import symptom_index
from keras_mgpu_plugins._compat_instances import applied_on
from keras_mgpu_plugins._compat_patches import (
    ALLOW_UNCHECKED_ENV,
    MIN_KERAS_FOR_DISTRIBUTION,
    PATCHES,
    Patch,
    UncheckedVersionError,
    apply,
    apply_to,
    check_keras_for_distribution,
    patch_keras,
    remove,
    remove_from,
    unpatch_keras,
)
from keras_mgpu_plugins._compat_private import (
    ArchiveNames,
    all_layers,
    archive_names,
    checkpoint_reports_finished_saves,
    h5_store_class,
    hide_from_progbar,
    keras_print_msg,
    local_replica_values,
    loss_tracker_rows,
    open_assets_store,
    open_h5_store,
    save_model_to_hdf5,
    save_state_walk,
    serialize_model_as_json,
    set_async_safe,
    set_initial_epoch,
)
from keras_mgpu_plugins._compat_record import order_problems, replace
from keras_mgpu_plugins._compat_trainer import (
    distributing,
    refuse_unsupported_settings,
    strategy_name,
)
from keras_mgpu_plugins._keras_private import (
    KERAS_HOOK_CALLS,
    KERAS_PRIVATE_HOOKS,
    PRIVATE_USES,
    PrivateUse,
    check_private_uses,
    keras_version,
    require,
)

__all__ = [
    "ALLOW_UNCHECKED_ENV", "KERAS_HOOK_CALLS", "KERAS_PRIVATE_HOOKS",
    "MIN_KERAS_FOR_DISTRIBUTION", "PATCHES", "UncheckedVersionError",
    "PRIVATE_USES", "ArchiveNames", "all_layers", "Patch", "PrivateUse", "archive_names",
    "check_keras_for_distribution", "check_private_uses", "checkpoint_reports_finished_saves",
    "distributing",
    "refuse_unsupported_settings", "hide_from_progbar",
    "keras_print_msg", "keras_version", "local_replica_values", "loss_tracker_rows",
    "open_assets_store", "open_h5_store", "h5_store_class", "patch_keras", "require",
    "save_model_to_hdf5", "save_state_walk", "serialize_model_as_json",
    "set_async_safe", "set_initial_epoch", "strategy_name", "unpatch_keras",
    "apply", "apply_to", "applied_on", "order_problems", "remove", "remove_from", "replace",
    "symptom_index",
]

from keras_mgpu_plugins._compat_hybrid import collective_ops_configured, this_task  # noqa: E402

__all__ += ["collective_ops_configured", "this_task"]
