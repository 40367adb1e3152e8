"""The private Keras API that `compat` touches: what, who needs it, which versions, checks.

`keras_mgpu_plugins.compat` is the only module that touches Keras internals;
each of its helpers names here the `PrivateUse` it relies on and calls
`require(name)` first. A `PrivateUse` records the Keras names relied on, what
in this package needs them, the Keras versions it is known for, and a `check`
naming what is missing or changed. `tests/unit/test_compat.py` runs every
check and exercises every helper in a real `fit`, so a Keras upgrade that
renames or reshapes one fails there first.

Versions. Run-tested: Keras 3.15.1 only. The lower bounds come from reading
the sources of the released wheels 3.0.0, 3.1.0, 3.2.0, 3.3.3, 3.4.1, 3.5.0,
3.6.0, 3.9.0, 3.10.0, 3.11.0 and 3.12.0: `min_version` is the first of those
with the names, signatures and calls the use needs. `max_version`
(exclusive) is 3.16.0, the first version nobody has looked at.

Outside its range a use is never trusted silently (`require`): its check
runs; if it fails, or the version is below the range, the use's documented
fallback applies (with one warning) or `RuntimeError` names what changed. If
the check passes on a newer Keras, the use goes on with one warning.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from packaging.version import Version

_warned: set[str] = set()

SAVING_LIB = "keras.src.saving.saving_lib"
LEGACY_H5 = "keras.src.legacy.saving.legacy_h5_format"
IO_UTILS = "keras.src.utils.io_utils"

#: Private methods of Keras classes that our subclasses override or call, with their parameters.
KERAS_PRIVATE_HOOKS: dict[str, dict[str, tuple[str, ...]]] = {
    "keras.callbacks.ModelCheckpoint": {
        "_save_model": ("self", "epoch", "batch", "logs"),  # overridden
        "_get_file_path": ("self", "epoch", "batch", "logs"),  # called
        "_should_save_model": ("self", "epoch", "batch", "logs", "filepath"),  # called
    },
    "keras.callbacks.EarlyStopping": {"_set_monitor_op": ("self",)},  # called
}
#: Public Keras hooks that must call a private one for an override of it to run.
KERAS_HOOK_CALLS: dict[str, tuple[tuple[str, str], ...]] = {
    "keras.callbacks.ModelCheckpoint": (
        ("on_epoch_end", "_save_model"), ("on_train_batch_end", "_save_model"),
    ),
}


@dataclasses.dataclass(frozen=True)
class PrivateUse:
    """One dependency on private Keras API: what, who, for which Keras versions.

    Attributes:
        name: Key for `require`.
        touches: The Keras names relied on.
        used_by: What in this package needs it.
        min_version: First Keras version known to have it.
        max_version: First version not checked (exclusive).
        check: Returns what is missing or changed (empty when all is there).
        outside: What happens when it is missing, changed, or below `min_version`.
        fallback: Whether `outside` is a fallback (`require` returns `False`)
            rather than an error (`require` raises).
    """

    name: str
    touches: str
    used_by: str
    min_version: str
    max_version: str
    check: Callable[[], list[str]]
    outside: str
    fallback: bool = False

    def applies_to(self, version: str) -> bool:
        return Version(self.min_version) <= Version(version) < Version(self.max_version)


def keras_version() -> str:
    import keras

    return keras.__version__


def require(name: str) -> bool:
    """Whether private use `name` may be used with the installed Keras.

    Runs the use's check. In its version range with the check passing: `True`.
    Newer Keras with the check passing: `True`, with one warning. Otherwise
    (check failing, or Keras older than the range): `False` with one warning
    for a use with a fallback, else `RuntimeError`.

    Raises:
        RuntimeError: Naming what changed, the known range and the remedy.
    """
    use = _BY_NAME[name]
    problems, version = use.check(), keras_version()
    span = f">={use.min_version},<{use.max_version}"
    if not problems and use.applies_to(version):
        return True
    if not problems and Version(version) >= Version(use.max_version):
        _warn_once(name, f"{use.used_by} relies on private Keras API ({use.touches}) checked "
                         f"for Keras {span}; Keras {version} still has it, so it is used.")
        return True
    reason = "; ".join(problems) or f"it is known not to hold before Keras {use.min_version}"
    message = (f"{use.used_by} relies on private Keras API checked for Keras {span}; with the "
               f"installed Keras {version}: {reason}. {use.outside}")
    if use.fallback:
        _warn_once(name, message)
        return False
    raise RuntimeError(message)


def check_private_uses() -> dict[str, list[str]]:
    """What is missing or changed, per private use (empty lists when all is there)."""
    return {use.name: use.check() for use in PRIVATE_USES}


def _warn_once(name: str, message: str) -> None:
    if name not in _warned:
        _warned.add(name)
        warnings.warn(message, UserWarning, stacklevel=3)


# --- checks -------------------------------------------------------------------------------


def _resolve(path: str) -> Any:
    import keras

    obj = keras
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _names_used(fn: Any) -> set[str]:
    """Attribute and global names, and string constants (`getattr(x, "name")`), in `fn`'s code."""
    code = inspect.unwrap(fn).__code__
    return set(code.co_names) | {c for c in code.co_consts if isinstance(c, str)}


def _check_hooks(class_path: str) -> list[str]:
    cls, problems = _resolve(class_path), []
    for method, expected in KERAS_PRIVATE_HOOKS[class_path].items():
        fn = getattr(cls, method, None)
        if fn is None:
            problems.append(f"{class_path}.{method} is missing")
        elif _params(fn) != expected:
            problems.append(f"{class_path}.{method}{_params(fn)} is not {method}{expected}")
    for hook, callee in KERAS_HOOK_CALLS.get(class_path, ()):
        if callee not in _names_used(getattr(cls, hook)):
            problems.append(f"{class_path}.{hook} no longer calls self.{callee}")
    return problems


def _check_names(module_name: str, names: Iterable[str]) -> list[str]:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return [f"{module_name} is missing"]
    return [f"{module_name}.{n} is missing" for n in names if not hasattr(module, n)]


def _check_saving() -> list[str]:
    problems = _check_names(SAVING_LIB, ("_save_state", "H5IOStore", "DiskIOStore",
                                          "_serialize_model_as_json", "_CONFIG_FILENAME",
                                          "_METADATA_FILENAME", "_VARS_FNAME_H5", "_ASSETS_DIRNAME"))
    problems += _check_names(LEGACY_H5, ("save_model_to_hdf5",))
    if problems:
        return problems
    sl = importlib.import_module(SAVING_LIB)
    if len(_params(sl._save_state)) != 5:
        problems.append(f"{SAVING_LIB}._save_state{_params(sl._save_state)} does not take 5 arguments")
    if _params(sl.H5IOStore.make) != ("self", "path", "metadata"):
        problems.append(f"{SAVING_LIB}.H5IOStore.make{_params(sl.H5IOStore.make)} takes no metadata")
    return problems


def _check_initial_epoch() -> list[str]:
    import keras

    if "_initial_epoch" not in _names_used(keras.Model.fit):
        return ["keras.Model.fit no longer reads self._initial_epoch"]
    return []


def _check_print_msg() -> list[str]:
    problems = _check_names(IO_UTILS, ("print_msg",))
    return problems or ([] if _params(importlib.import_module(IO_UTILS).print_msg)[:1] == ("message",)
                        else [f"{IO_UTILS}.print_msg does not take a message first"])


def _check_callback_list() -> list[str]:
    import types

    import keras

    holder = types.SimpleNamespace()
    mine = keras.callbacks.Callback()
    made = keras.callbacks.CallbackList([mine], add_history=True, add_progbar=True, model=holder)
    order = [type(c).__name__ for c in made.callbacks]
    problems = [] if order == ["Callback", "History", "ProgbarLogger"] else [
        f"CallbackList orders the callbacks {order}, not [user's..., History, ProgbarLogger]"]
    if getattr(holder, "history", None) is not made.callbacks[1]:
        problems.append("CallbackList.set_model no longer sets model.history")
    return problems


def _check_async_safe() -> list[str]:
    import keras

    dispatch = getattr(keras.callbacks.CallbackList, "_configure_async_dispatch", None)
    if dispatch is None or "async_safe" not in _names_used(dispatch):
        return ["CallbackList no longer reads a callback's async_safe"]
    return []


def _check_loss_tracker() -> list[str]:
    import keras

    problems = []
    if "count" not in _names_used(keras.metrics.Mean.__init__):
        problems.append("keras.metrics.Mean no longer creates `count`")
    if "_loss_tracker" not in _names_used(keras.Model.train_step):
        problems.append("keras.Model.train_step no longer updates self._loss_tracker")
    return problems


def _check_flatten_layers() -> list[str]:
    import keras

    fn = getattr(keras.layers.Layer, "_flatten_layers", None)
    if fn is None or "include_self" not in _params(fn):
        return ["keras.layers.Layer._flatten_layers(include_self=...) is missing"]
    return []


_MAX = "3.16.0"
PRIVATE_USES: tuple[PrivateUse, ...] = (
    PrivateUse("model_checkpoint_hooks", "ModelCheckpoint._save_model (overridden), "
               "_get_file_path, _should_save_model", "kmp.callbacks.ModelCheckpoint", "3.10.0",
               _MAX, lambda: _check_hooks("keras.callbacks.ModelCheckpoint"),
               "Use keras.callbacks.ModelCheckpoint on one worker, or a Keras version in that range."),
    PrivateUse("saving_internals", f"{SAVING_LIB} (_save_state, H5IOStore, DiskIOStore, "
               f"_serialize_model_as_json, archive names), {LEGACY_H5}.save_model_to_hdf5",
               "kmp.callbacks.ModelCheckpoint (with async_save=True, or several workers)",
               "3.6.0", _MAX, _check_saving,
               "Use async_save=False on one worker, or a Keras version in that range."),
    PrivateUse("initial_epoch", "Model._initial_epoch (read by fit after on_train_begin)",
               "kmp.callbacks.BackupAndRestore (restoring the epoch)", "3.1.0", _MAX,
               _check_initial_epoch, "Use a Keras version in that range."),
    PrivateUse("monitor_op", "EarlyStopping._set_monitor_op (mode='auto' inference)",
               "kmp.callbacks.EarlyStopping", "3.0.0", _MAX,
               lambda: _check_hooks("keras.callbacks.EarlyStopping"),
               "Use keras.callbacks.EarlyStopping on one worker, or a Keras version in that range."),
    PrivateUse("print_msg", f"{IO_UTILS}.print_msg", "kmp.callbacks.ModelCheckpoint messages",
               "3.0.0", _MAX, _check_print_msg,
               "Messages go through print or logging instead (keras_print_msg).", fallback=True),
    PrivateUse("progbar_after_history", "CallbackList appends History then ProgbarLogger after "
               "the user's callbacks; sets model.history", "kmp.callbacks.DeviceMetricsLogger("
               "progbar='summary')", "3.0.0", _MAX, _check_callback_list,
               "The progress bar shows every key (as progbar='all').", fallback=True),
    PrivateUse("async_safe", "Callback.async_safe (read by CallbackList's async dispatch)",
               "kmp.callbacks.BackupAndRestore", "3.6.0", _MAX, _check_async_safe,
               "Batch hooks are dispatched synchronously (slower, same results).", fallback=True),
    PrivateUse("loss_tracker_rows", "the 'loss' Mean tracker's count, weighted by rows in "
               "train_step", "kmp.callbacks.DeviceMetricsLogger and WandbLogger (batch sizes)",
               "3.2.0", _MAX, _check_loss_tracker, "Rows are not measured: pass batch_size= to "
               "DeviceMetricsLogger; WandbLogger records no measured batch size.", fallback=True),
)
PRIVATE_USES += (
    PrivateUse("flatten_layers", "Layer._flatten_layers (every nested layer, custom layers' "
               "attributes included)", "kmp.parallelize(sync_batchnorm=True)", "3.0.0", _MAX,
               _check_flatten_layers, "Use BatchNormalization(synchronized=True) in the factory."),
)
_BY_NAME = {use.name: use for use in PRIVATE_USES}



# --- model parallelism (kmp.parallelize(strategy="model_parallel")) ------------------------
# Keras 3 on TensorFlow re-runs a functional graph without the device scopes its layers were
# called under (DESIGN.md, "Model parallelism on the TensorFlow backend"): placing each call
# node needs the graph's nodes and the hook that runs them. No upstream issue: keras.distribution
# is JAX-only on TensorFlow by design (keras/src/backend/tensorflow/distribution_lib.py).
FUNCTION_MODULE = "keras.src.ops.function"


def _check_model_parallel() -> list[str]:
    import keras

    problems = []
    function = _resolve(f"{FUNCTION_MODULE}.Function")
    if function is None or _params(getattr(function, "_run_through_graph", None))[:3] != (
            "self", "inputs", "operation_fn"):
        problems.append("Function._run_through_graph(self, inputs, operation_fn, ...) changed")
    elif "_nodes_by_depth" not in _names_used(function._run_through_graph):
        problems.append("Function._run_through_graph no longer walks _nodes_by_depth")
    if "_functional" not in _names_used(keras.Sequential.call):
        problems.append("keras.Sequential.call no longer delegates to self._functional")
    variable = _resolve("keras.src.backend.tensorflow.core.Variable")
    if variable is None or "_value" not in _names_used(getattr(variable, "_initialize", None)):
        problems.append("the TensorFlow Variable no longer keeps its tf.Variable in _value")
    if "_compute_loss" not in _names_used(keras.Model.train_step):
        problems.append("keras.Model.train_step no longer calls self._compute_loss")
    return problems


PRIVATE_USES = (*PRIVATE_USES, PrivateUse(
    "model_parallel_graph", "Function._run_through_graph, _nodes_by_depth, Node.operation, "
    "KerasTensor._keras_history, Sequential._functional, tf Variable._value/_initialize, "
    "Model._compute_loss/_loss_tracker", "kmp.parallelize(strategy='model_parallel')", "3.6.0",
    _MAX, _check_model_parallel, "Use strategy='mirrored' or tf.device inside your layers' "
    "own call, or a Keras version in that range."))
_BY_NAME[PRIVATE_USES[-1].name] = PRIVATE_USES[-1]


def graph_of(model: Any) -> Any:
    """The `Function` whose nodes a Sequential or functional model runs, else `None`."""
    import keras

    if isinstance(model, keras.Sequential):
        return getattr(model, "_functional", None)
    return model if hasattr(model, "_nodes_by_depth") and hasattr(model, "_run_through_graph") \
        else None


def call_nodes(graph: Any) -> list[Any]:
    """The graph's layer-call nodes in the order `_run_through_graph` runs them (no inputs)."""
    nodes = []
    for depth in sorted(graph._nodes_by_depth, reverse=True):
        nodes.extend(n for n in graph._nodes_by_depth[depth] if n.operation and not n.is_input)
    return nodes


def node_of(tensor: Any) -> Any:
    """The node that produced a symbolic tensor, or `None` for a concrete one."""
    history = getattr(tensor, "_keras_history", None)
    if history is None:
        return None
    return history.operation._inbound_nodes[history.node_index]


def current_device() -> str:
    """The device scope in effect now (eager), as TensorFlow spells it; '' for none."""
    from tensorflow.python.eager import context

    return context.context().device_name or ""


def call_index(node: Any) -> int:
    """Which call of its layer a node is, in the order the calls were made (0 first)."""
    return node.operation._inbound_nodes.index(node)


def hook_graph_run(graph: Any, make_operation_fn: Callable[[Any], Any]) -> None:
    """Makes `graph` run each node's operation through `make_operation_fn(operation_fn)`.

    `make_operation_fn` gets Keras's own `operation_fn` for this run and returns the
    replacement, which is called once per node in `call_nodes` order.
    """
    original = graph._run_through_graph

    def run_through_graph(inputs: Any, operation_fn: Any = lambda op: op, call_fn: Any = None):
        return original(inputs, operation_fn=make_operation_fn(operation_fn), call_fn=call_fn)

    graph._run_through_graph = run_through_graph


def move_variable(variable: Any, device: str) -> None:
    """Re-creates a Keras variable's `tf.Variable` on `device`: same name, path and value."""
    import tensorflow as tf

    old = variable._value
    if old is None:  # not yet initialised: it will be created where its layer builds
        return
    here, there = tf.DeviceSpec.from_string(old.device), tf.DeviceSpec.from_string(device)
    if (here.device_type, here.device_index) == (there.device_type, there.device_index):
        return
    with tf.device(device):
        variable._value = tf.Variable(
            old.read_value(), dtype=old.dtype, trainable=old.trainable,
            name=old.name.rsplit(":", 1)[0],
            aggregation=old.aggregation, synchronization=old.synchronization,
        )


def compute_loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """Keras's training loss for one (micro-)batch, tracked in the 'loss' metric as fit does."""
    import keras
    import tensorflow as tf
    from keras.src.losses import loss as loss_module

    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=True)
    rows = tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0]
    model._loss_tracker.update_state(loss_module.unscale_loss_for_distribution(loss),
                                     sample_weight=rows)
    return loss


def call_has_training_arg(model: Any) -> bool:
    return bool(getattr(model, "_call_has_training_arg", True))
