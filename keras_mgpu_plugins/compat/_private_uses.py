"""The private Keras and TensorFlow API that `compat` touches: what, who needs it, versions, checks.

`keras_mgpu_plugins.compat` and the TensorFlow patches alone touch Keras internals, through
`compat._names`; each helper names the `PrivateUse` it relies on and calls `require(name)`
first (checks: `compat._checks`). A `PrivateUse` records the names relied on, what needs
them, the versions it is known for, and a `check` naming what is missing or changed;
`tests/unit/test_compat.py` runs every check and every helper in a real `fit`.

Versions. Run-tested: Keras 3.10.0 (TensorFlow 2.16.2) and 3.15.1 (TensorFlow 2.21), both in
CI (`tests/unit/test_compat.py` on each). The lower bounds come from reading the sources of
the released wheels 3.0.0, 3.1.0, 3.2.0, 3.3.3, 3.4.1, 3.5.0, 3.6.0, 3.9.0, 3.10.0, 3.11.0 and
3.12.0: `min_version` is the first of those with the names, signatures and calls the use
needs. `max_version` (exclusive) is `CHECKED_BELOW["keras"]` (3.16.0), the first release CI has not run
(keras-nightly 3.16.0.dev is run by the canary, `.ci/run canary`). TensorFlow
internals (`library="tensorflow"`) are known for TensorFlow 2.16 to 2.21 (the
range of the TensorFlow patches in `PATCHES`): `max_version` 2.22.0.

Outside its range a use is never trusted silently (`require`): its check runs; if it fails,
or the version is below the range, the use's documented fallback applies (with one warning)
or `RuntimeError` names what changed; passing on a newer Keras, it goes on with one warning. A check
runs once per use and Keras version (`require` caches what it found). A check that
raises (a private name moved where `compat._names` does not know it) counts as failing,
with what it raised: never an exception out of `check_private_uses`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

from keras_mgpu_plugins.compat import _checks as checks
from keras_mgpu_plugins.compat import _jax_checks as jax_checks
from keras_mgpu_plugins.compat import _names, _policy
from keras_mgpu_plugins.compat._checks import CHECKED_BELOW, KERAS_HOOK_CALLS, KERAS_PRIVATE_HOOKS
from keras_mgpu_plugins.errors import UncheckedVersionError

__all__ = [
    "KERAS_HOOK_CALLS", "KERAS_PRIVATE_HOOKS", "PRIVATE_USES", "PrivateUse",
    "check_private_uses", "keras_version", "require",
]

_warned: set[tuple[str, str]] = set()
#: What each use's check found, per (use name, Keras version): `require` checks once per version.
_checked: dict[tuple[str, str], list[str]] = {}


@dataclasses.dataclass(frozen=True)
class PrivateUse:
    """One dependency on private Keras (or TensorFlow) API: what, who, for which versions.

    Attributes:
        name: Key for `require`.
        touches: The Keras (or TensorFlow) names relied on.
        used_by: What in this package needs it.
        min_version: First version of `library` known to have it.
        max_version: First version not checked (exclusive).
        check: Returns what is missing or changed (empty when all is there); use
            `problems()`, which turns an exception into a problem.
        outside: What happens when it is missing, changed, or below `min_version`.
        fallback: Whether `outside` is a fallback (`require` returns `False`)
            rather than an error (`require` raises).
        library: Whose internals and versions: "keras", "tensorflow", "jax" or "torch".
        backend: The Keras backend whose lane relies on it ("" for any).
    """

    name: str
    touches: str
    used_by: str
    min_version: str
    max_version: str
    check: Callable[[], list[str]]
    outside: str
    fallback: bool = False
    library: str = "keras"
    backend: str = ""

    def applies_to(self, version: str) -> bool:
        return checks.version_checked(version, self.min_version, self.max_version)

    def problems(self) -> list[str]:
        """What `check` finds missing or changed; a check that raises says what it raised."""
        try:
            return list(self.check())
        except Exception as err:  # noqa: BLE001 - any failure of a check is a problem found
            return [f"its check raised {type(err).__name__}: {err}"]


def keras_version() -> str:
    import keras

    return keras.__version__


def library_version(library: str) -> str:
    """The installed version of "keras", "tensorflow" or "jax"."""
    return _names.library_version(library)


def require(name: str) -> bool:
    """Whether private use `name` may be used with the installed Keras.

    Runs the use's check, once per Keras version (the result is cached). In its
    version range with the check passing: `True`. Newer Keras with the check
    passing: `True`, with one warning. Otherwise (check failing, or Keras older
    than the range): `False` with one warning for a use with a fallback, else
    `UncheckedVersionError` (a `RuntimeError`).

    Raises:
        UncheckedVersionError: Naming what changed, the known range and the remedy.
    """
    use = _BY_NAME[name]
    version, lib = library_version(use.library), checks.LIBRARY_NAMES[use.library]
    if (name, version) not in _checked:
        _checked[name, version] = use.problems()
    problems = _checked[name, version]
    span = f">={use.min_version},<{use.max_version}"
    if not problems and use.applies_to(version):
        return True
    if not problems and not checks.version_predates(version, use.min_version):
        if _policy.folded(use.library):  # the one warning of an unchecked Keras stands for it
            return True
        _warn_once(name, f"{use.used_by} relies on private {lib} API ({use.touches}) checked "
                         f"for {lib} {span}; {lib} {version} still has it, so it is used.")
        return True
    reason = "; ".join(problems) or f"it is known not to hold before {lib} {use.min_version}"
    message = (f"{use.used_by} relies on private {lib} API checked for {lib} {span}; with the "
               f"installed {lib} {version}: {reason}. {use.outside}")
    if use.fallback:
        _warn_once(name, message)
        return False
    raise UncheckedVersionError(message)


def check_private_uses() -> dict[str, list[str]]:
    """What is missing or changed, per private use (checked afresh: no cache; never raises)."""
    return {use.name: use.problems() for use in PRIVATE_USES}


def _warn_once(name: str, message: str) -> None:
    """Warns `message` about use `name` once per process (a use may have two: used outside its
    range, then its fallback once its check fails)."""
    if (name, message) not in _warned:
        _warned.add((name, message))
        warnings.warn(message, UserWarning, stacklevel=3)


_MAX, _TF_MAX = CHECKED_BELOW["keras"], CHECKED_BELOW["tensorflow"]


PRIVATE_USES: tuple[PrivateUse, ...] = (
    PrivateUse("model_checkpoint_hooks", "ModelCheckpoint._save_model (overridden), "
               "_get_file_path, _should_save_model", "kmp.callbacks.ModelCheckpoint", "3.10.0",
               _MAX, lambda: checks.check_hooks("keras.callbacks.ModelCheckpoint"),
               "Use keras.callbacks.ModelCheckpoint on one worker, or a Keras version in that range."),
    PrivateUse("saving_internals", "saving_lib (_save_state, H5IOStore, DiskIOStore, "
               "_serialize_model_as_json, archive names), legacy h5 format.save_model_to_hdf5",
               "kmp.callbacks.ModelCheckpoint (with async_save=True, or several workers)",
               "3.6.0", _MAX, checks.check_saving,
               "Use async_save=False on one worker, or a Keras version in that range."),
    PrivateUse("initial_epoch", "Model._initial_epoch (read by fit after on_train_begin)",
               "kmp.callbacks.BackupAndRestore (restoring the epoch)", "3.1.0", _MAX,
               checks.check_initial_epoch, "Use a Keras version in that range."),
    PrivateUse("fit_epoch_iterator", "fit's local epoch_iterator (made before on_train_begin, "
               "looped over after it: read from the running fit's frame) and "
               "EpochIterator._enumerate_iterator (the generator of its steps, each with the "
               "iterator of the epoch's batches; TensorFlow, JAX and torch alike)",
               "kmp.callbacks.BackupAndRestore (resuming mid-epoch: the batches trained before "
               "the backup are drawn and dropped before any callback sees them)", "3.10.0",
               _MAX, lambda: _lazy_check("keras_mgpu_plugins.compat._trainer",
                                         "check_fit_epoch_iterator"),
               "Use a Keras version in that range, or save_freq='epoch' (a backup at an "
               "epoch's end resumes at the next epoch's start)."),
    PrivateUse("train_function_watched", "Trainer.train_function (replaced on the instance for "
               "one fit: each call timed, the first run through the backend's FLOP counter; "
               "called as WATCHED_TRAIN_FUNCTION_CALLS says)", "kmp.callbacks.DeviceMetricsLogger "
               "(step phases for the straggler report, FLOPs for MFU)", "3.1.0", _MAX,
               lambda: checks.check_train_function(checks.WATCHED_TRAIN_FUNCTION_CALLS),
               "DeviceMetricsLogger logs no phases of the step, no FLOPs and no MFU.", fallback=True),
    PrivateUse("print_msg", "io_utils.print_msg", "kmp.callbacks.ModelCheckpoint messages",
               "3.0.0", _MAX, checks.check_print_msg,
               "Messages go through print or logging instead (keras_print_msg).", fallback=True),
    PrivateUse("progbar_after_history", "CallbackList appends History then ProgbarLogger after "
               "the user's callbacks; sets model.history", "kmp.callbacks.DeviceMetricsLogger("
               "progbar='summary')", "3.0.0", _MAX, checks.check_callback_list,
               "The progress bar shows every key (as progbar='all').", fallback=True),
    PrivateUse("async_safe", "Callback.async_safe (read by CallbackList's async dispatch)",
               "kmp.callbacks.BackupAndRestore", "3.6.0", _MAX, checks.check_async_safe,
               "Batch hooks are dispatched synchronously (slower, same results).", fallback=True),
    PrivateUse("loss_tracker_rows", "the 'loss' Mean tracker's count, weighted by rows in "
               "train_step", "kmp.callbacks.DeviceMetricsLogger and WandbLogger (batch sizes)",
               "3.2.0", _MAX, checks.check_loss_tracker, "Rows are not measured: pass batch_size= to "
               "DeviceMetricsLogger; WandbLogger records no measured batch size.", fallback=True,
               backend="tensorflow"),
    PrivateUse("flatten_layers", "Layer._flatten_layers (every nested layer, custom layers' "
               "attributes included)", "kmp.parallelize(sync_batchnorm=True)", "3.0.0", _MAX,
               checks.check_flatten_layers, "Use BatchNormalization(synchronized=True) in the factory."),
    PrivateUse("model_parallel_graph", "Function._run_through_graph, _nodes_by_depth, "
               "Node.operation, KerasTensor._keras_history, Sequential._functional, tf Variable"
               "._value/_initialize, Model._compute_loss/_loss_tracker",
               "kmp.parallelize(strategy='model_parallel')", "3.6.0", _MAX, checks.check_model_parallel,
               "Use strategy='mirrored' or tf.device inside your layers' own call, or a Keras "
               "version in that range.", backend="tensorflow"),
    PrivateUse("collective_all_reduce_multi_worker", "tensorflow trainer module."
               "_collective_all_reduce_multi_worker (is a strategy multi-worker, as fit asks)",
               "the workarounds in PATCHES (which strategies they act under)", "3.0.0", _MAX,
               checks.check_collective_all_reduce, "Use a Keras version in that range.",
               backend="tensorflow"),
    PrivateUse("patch_internals", f"{', '.join(checks.PATCH_INTERNALS)} (used inside the "
               "patched methods)",
               "the workarounds in PATCHES", "3.10.0", _MAX, checks.check_patch_internals,
               "Use a Keras version in that range.", backend="tensorflow"),
    PrivateUse("eager_context", "eager context: context().device_name, "
               "host_address_space(), _collective_ops_server_def",
               "kmp.parallelize(strategy='model_parallel' or 'hybrid'), kmp.collective (this "
               "process's task)", "2.16.0", _TF_MAX, checks.check_eager_context,
               "Use a TensorFlow version in that range.", library="tensorflow"),
    PrivateUse("tf_maybe_merge_call", "tf.__internal__.distribute.interim.maybe_merge_call",
               "the clip_after_all_reduce patch (the EMA overwrite under a strategy)", "2.16.0",
               _TF_MAX, checks.check_maybe_merge_call, "Use a TensorFlow version in that range.",
               library="tensorflow"),
    PrivateUse("distributed_input_lib", "distributed iterator "
               "(get_next_as_optional, _get_next_no_partial_batch_handling)",
               "the full_batch_executions_skip_input_check patch", "2.16.0", _TF_MAX,
               checks.check_input_lib, "Use a TensorFlow version in that range.",
               library="tensorflow"),
    PrivateUse("distributed_element_spec", "tensorflow epoch iterator._distributed_dataset "
               "(the distributed dataset fit and evaluate iterate: its element_spec) and "
               "TensorFlow's per replica spec._value_specs (each replica's spec)",
               "the symbolic_build_from_element_spec patch (the model built before the first "
               "step without an iterator of the input)", "3.10.0", _MAX,
               lambda: _lazy_check("keras_mgpu_plugins.backends.tensorflow.patches."
                                   "element_spec", "check_element_spec"),
               "Use a Keras version in that range.", backend="tensorflow"),
    PrivateUse("tf_coordination_store", "eager context: context().set_config_key_value, "
               "get_config_key_value(key, timeout_in_ms), coordination_service (the key-value "
               "store of TensorFlow's coordination service, which MultiWorkerMirroredStrategy "
               "starts)", "kmp's check that every TensorFlow worker makes the same "
               "fit/evaluate/predict call (feature same_calls_on_every_worker, runtime.calls)",
               "2.16.0", _TF_MAX, checks.check_coordination_store,
               "The check is skipped: a fit/evaluate/predict made on one worker only waits for "
               "the others until TensorFlow's collective fails or kmp-launch's --stall-timeout "
               "reports it.", fallback=True, library="tensorflow"),
    PrivateUse("parameter_server_trainer", "tensorflow trainer."
               "_distribute_strategy (set to None around evaluate/predict on the chief), "
               "base trainer._symbolic_build(data_batch=) (the variables made before any step), "
               "stateless scope module.in_stateless_scope and "
               "common variable.assign_add's source for the "
               "atomic_variable_updates patch",
               "kmp's parameter-server fit, evaluate and predict "
               "(backends/tensorflow/parameter_server)", "3.10.0", _MAX,
               lambda: _lazy_check("keras_mgpu_plugins.backends.tensorflow.patches."
                                   "ps_trainer", "check_trainer"),
               "Use a Keras version in that range."),
    PrivateUse("tf_sharded_variable", "sharded variable (.variables: the shards a variable_partitioner makes)",
               "kmp's partitioned variables under parameter servers (patches.sharded)",
               "2.16.0", _TF_MAX,
               lambda: _lazy_check("keras_mgpu_plugins.backends.tensorflow.patches.sharded",
                                   "check_sharded_variable"),
               "Use a TensorFlow version in that range, or variable_partitioner=None.",
               library="tensorflow"),
    PrivateUse("jax_initialize_rng", "jax distribution_lib.initialize_rng "
               "(what keras.distribution.initialize runs after jax.distributed.initialize)",
               "kmp's JAX initialize (one random seed on every process)", "3.0.0", _MAX,
               lambda: _missing("jax distribution_lib"),
               "The chief's random seed is broadcast and set with keras.utils.set_random_seed.",
               fallback=True, backend="jax"),
    PrivateUse("jax_backends_started", "jax xla_bridge.backends_are_initialized",
               "kmp.topology() on JAX (the local devices are named without starting JAX, so "
               "simulate_devices and jax.distributed can still follow)", "0.4.30",
               CHECKED_BELOW["jax"], lambda: _missing("jax xla_bridge"),
               "kmp.topology() lists JAX's devices, which starts JAX's backend: call "
               "kmp.simulate_devices or let the launcher initialise jax.distributed first.",
               fallback=True, library="jax"),
    PrivateUse("jax_distribute_data", "jax trainer module._distribute_data (every "
               "batch of fit/evaluate/predict and *_on_batch laid out under a distribution)",
               "kmp's JAX partial batches (a batch whose rows do not divide over the devices is "
               "fed whole to every device: patch jax_partial_batches_replicated)", "3.10.0", _MAX,
               lambda: _missing("jax trainer module"),
               "kmp refuses a batch whose rows do not divide over the devices, naming it."),
    PrivateUse("jax_coordination_client", "jax distributed.global_state.client "
               "(key_value_set, key_value_dir_get, key_value_try_get: the key-value store of "
               "jax.distributed's coordination service)",
               "kmp's check that every JAX process makes the same fit/evaluate/predict call "
               "(backends.jax.calls)", "0.5.1", "0.12.0", jax_checks.check_jax_client,
               "The check is skipped: a fit/evaluate/predict made on one process only waits "
               "for the others (kmp-launch --stall-timeout reports it).", fallback=True,
               library="jax"),
    PrivateUse("jax_variable_relayout", "jax variable (_layout, "
               "_direct_assign: how Keras lays a variable out under a distribution)",
               "kmp's JAX compile outside the factory (an optimizer made outside the model's "
               "distribution gets its layout)", "3.10.0", _MAX, jax_checks.check_jax_variable,
               "Create the optimizer inside the distribution: compile(optimizer='sgd') by name, "
               "or build it in the @kmp.parallelize factory."),
)
from keras_mgpu_plugins.compat._shuffle_checks import SHUFFLE_PRIVATE_USE  # noqa: E402
from keras_mgpu_plugins.compat._torch_uses import TORCH_PRIVATE_USES  # noqa: E402

PRIVATE_USES += tuple(PrivateUse(**fields) for fields in (SHUFFLE_PRIVATE_USE,
                                                           *TORCH_PRIVATE_USES))
_BY_NAME = {use.name: use for use in PRIVATE_USES}


def _lazy_check(module: str, name: str) -> list[str]:
    """A check defined beside the code that relies on the private API."""
    import importlib

    return importlib.import_module(module).__dict__[name]()


def _missing(key: str) -> list[str]:
    """What of the JAX-lane name `key` is missing (nothing to check where JAX is not installed:
    it is reached on the JAX backend only)."""
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        return []
    return _names.missing(key)
