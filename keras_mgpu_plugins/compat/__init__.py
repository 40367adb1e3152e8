"""Every change kmp makes to Keras/TensorFlow behaviour, and every private API it uses, in one place.

This package is the public entry point (`kmp.compat`). Its private modules hold the
registry; each backend's patches live with the backend (`backends/tensorflow/patches/`),
and reach the registry as records:

- `_record`: the record, `Patch`: the upstream issue (or the code it relies on), the
  symptom without it, what it replaces (`wraps`), the patch it must wrap where two
  replace one method (`after`; `order_problems` checks the table, applying keeps the
  order whatever order the calls come in), the versions it was checked for, a
  `present()` check, and whether its absence changes training results
  (`changes_results`: such a patch fails closed outside its checked range, newer
  versions and any pre-release, with `UncheckedVersionError`, unless
  `KMP_ALLOW_UNCHECKED_VERSIONS=1`).
- `_table`: the workarounds of upstream bugs (`kind="workaround"`, applied together by
  `patch_keras()`); `_features`: the wrappers kmp's own features install
  (`kind="feature"`, applied where each feature needs it).
- `_registry`: `PATCHES` (the one table), `patch_keras()`, `apply(name, ...)` for a Keras
  class or module, `apply_to(name, obj, ...)` for one object, `unpatch_keras()` (undoes
  every one; per-instance bookkeeping in `_instances`). `_index` renders the
  "symptom → patch" table of docs/troubleshooting.md from the records.
- The TensorFlow backend's patches (`backends/tensorflow/patches/`): `trainer` (symbolic
  build, scalar log reduce, `steps_per_execution`; also `distributing`,
  `refuse_unsupported_settings`), `element_spec` (the symbolic build from the input's
  element spec, no batch drawn), `loss_scale`, `compile_settings` (`jit_compile=True`,
  `gradient_accumulation_steps`, `compile` again outside the strategy's scope),
  `optimizer` (clipping after the all-reduce, the EMA overwrite, sparse gradients),
  `data` (forked `PyDataset` workers; TensorFlow writing into a generator's arrays),
  `iterators`, `input_check`, `custom_step`, `functional_graph` (model parallelism's
  helpers over Keras's functional graph) and `hybrid`. `_env` is the one workaround set
  through the environment: glibc's malloc top pad for the workers kmp starts, applied
  by the launcher (`launch._tuning`).
- `_names`: every private Keras/TensorFlow/JAX name kmp touches, with where it lived
  in each version (`NAMES`; the TensorFlow trainer's rename in keras-nightly 3.16.0.dev
  included). The patches, checks and helpers reach internals only through
  `resolve(key)`; a name at none of its known places raises `MissingNameError`, an
  `UncheckedVersionError` naming it, and a patch wrapping it is refused before training.
- `_report`: `report()` (also `python -m keras_mgpu_plugins.compat`): every patch's
  verdict, private use and private name on the installed versions; `_canary`: what the
  last canary run (`.ci/run canary`, keras-nightly) found.
- `_private`: the helpers over private Keras API the rest of the package calls
  (`set_initial_epoch`, `loss_tracker_rows`, ...), through this module.
- `_private_uses`: the private-API registry. Each helper calls `require(name)` for the
  `PrivateUse` it relies on (Keras's or TensorFlow's: `PrivateUse.library`), which records
  the versions it is known for and checks (once per version) that it is still there
  (`PRIVATE_USES`, `KERAS_PRIVATE_HOOKS`; the checks are in `_checks`). Outside that range
  a use has a documented fallback or raises a `RuntimeError` naming what changed.

Users who build their own `tf.distribute.MultiWorkerMirroredStrategy` call
`kmp.compat.patch_keras()` once; `parallelize` does it for them. Tests that replace a
patch-machinery name (`PATCHES`, `_warned_patches`, `_applied`) do so in `_registry`,
where `patch_keras` reads it.
"""

from __future__ import annotations

from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing
from keras_mgpu_plugins.backends.tensorflow.patches.trainer import refuse_unsupported_settings
from keras_mgpu_plugins.backends.tensorflow.rank import strategy_name
from keras_mgpu_plugins.compat._index import symptom_index
from keras_mgpu_plugins.compat._instances import applied_on
from keras_mgpu_plugins.compat._names import NAMES, MissingNameError, PrivateName
from keras_mgpu_plugins.compat._private import (
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
    rows_countable,
    save_model_to_hdf5,
    save_state_walk,
    serialize_model_as_json,
    set_async_safe,
    set_initial_epoch,
)
from keras_mgpu_plugins.compat._private_uses import (
    KERAS_HOOK_CALLS,
    KERAS_PRIVATE_HOOKS,
    PRIVATE_USES,
    PrivateUse,
    check_private_uses,
    keras_version,
    require,
)
from keras_mgpu_plugins.compat._record import order_problems, replace
from keras_mgpu_plugins.compat._registry import (
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
from keras_mgpu_plugins.compat._report import CompatReport, PatchVerdict, report
from keras_mgpu_plugins.compat._step_watch import watch_steps
from keras_mgpu_plugins.compat._trainer import fit_epoch_iterator, skip_trained_batches

__all__ = [
    "ALLOW_UNCHECKED_ENV", "KERAS_HOOK_CALLS", "KERAS_PRIVATE_HOOKS",
    "MIN_KERAS_FOR_DISTRIBUTION", "PATCHES", "UncheckedVersionError",
    "PRIVATE_USES", "ArchiveNames", "all_layers", "Patch", "PrivateUse", "archive_names",
    "check_keras_for_distribution", "check_private_uses", "checkpoint_reports_finished_saves",
    "distributing",
    "refuse_unsupported_settings", "hide_from_progbar",
    "keras_print_msg", "keras_version", "local_replica_values", "loss_tracker_rows", "rows_countable",
    "open_assets_store", "open_h5_store", "h5_store_class", "patch_keras", "require",
    "save_model_to_hdf5", "save_state_walk", "serialize_model_as_json",
    "set_async_safe", "set_initial_epoch", "skip_trained_batches", "fit_epoch_iterator",
    "strategy_name", "unpatch_keras",
    "apply", "apply_to", "applied_on", "order_problems", "remove", "remove_from", "replace",
    "symptom_index", "NAMES", "PrivateName", "MissingNameError", "CompatReport", "PatchVerdict",
    "report", "watch_steps",
]

from keras_mgpu_plugins.backends.tensorflow.patches.hybrid import (  # noqa: E402
    collective_ops_configured,
    this_task,
)

__all__ += ["collective_ops_configured", "this_task"]
