"""Every Keras/TensorFlow workaround and every use of private Keras API, in one place.

Patches. Each names the upstream issue it works around, the Keras versions it
is known for (it is applied only there), and is tested by a real multi-worker
run that fails without it (`tests/multi_worker/test_fit.py`). Users who build
their own `tf.distribute.MultiWorkerMirroredStrategy` call
`kmp.compat.patch_keras()` once; `parallelize` does it for them.

Private API. The rest of the package touches no Keras internal: it calls the
small helpers below (`set_initial_epoch`, `loss_tracker_rows`, ...). Each one
calls `require(name)` for the `PrivateUse` it relies on, which records the
Keras versions it is known for and checks that it is still there
(`PRIVATE_USES`, `KERAS_PRIVATE_HOOKS`, in `keras_mgpu_plugins._keras_private`).
Outside that range a use either has a documented fallback or raises a
`RuntimeError` naming what changed; `tests/unit/test_compat.py` tests each one.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from packaging.version import Version

from keras_mgpu_plugins._keras_private import (
    IO_UTILS,
    KERAS_HOOK_CALLS,
    KERAS_PRIVATE_HOOKS,
    LEGACY_H5,
    PRIVATE_USES,
    SAVING_LIB,
    PrivateUse,
    check_private_uses,
    keras_version,
    require,
)

__all__ = [
    "KERAS_HOOK_CALLS", "KERAS_PRIVATE_HOOKS", "MIN_KERAS_FOR_DISTRIBUTION", "PATCHES",
    "PRIVATE_USES", "ArchiveNames", "all_layers", "Patch", "PrivateUse", "archive_names",
    "check_keras_for_distribution", "check_private_uses", "distributing",
    "refuse_unsupported_settings", "hide_from_progbar",
    "keras_print_msg", "keras_version", "local_replica_values", "loss_tracker_rows",
    "open_assets_store", "open_h5_store", "h5_store_class", "patch_keras", "require",
    "resolve_monitor_op", "save_model_to_hdf5", "save_state_walk", "serialize_model_as_json",
    "set_async_safe", "set_initial_epoch", "unpatch_keras",
]
logger = logging.getLogger("keras_mgpu_plugins")

_lock = threading.Lock()
_applied: dict[str, Any] = {}
_warned_patches: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Patch:
    """A workaround: what it fixes, where, and for which Keras versions.

    Attributes:
        name: Its name, as `patch_keras()` returns it.
        upstream: The upstream issue.
        min_version: First Keras version with the code it fixes (read from the
            released sources); older ones do not have that code.
        max_version: First version nobody has checked (exclusive).
        apply: Applies it; returns a function that undoes it.
        present: Whether the installed Keras still has the code it fixes
            (`None` when its source cannot be read).
    """

    name: str
    upstream: str
    min_version: str
    max_version: str  # exclusive: the first version not known to need it
    apply: Callable[[], Any]
    present: Callable[[], bool | None] = lambda: None

    def applies_to(self, version: str) -> bool:
        v = Version(version)
        return Version(self.min_version) <= v < Version(self.max_version)


def _source_has(obj: Any, *needles: str) -> bool | None:
    """Whether `obj`'s source holds every needle; `None` if the source cannot be read."""
    import inspect

    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    return all(needle in source for needle in needles)


# --- keras-team/keras#20585 (1/2): symbolic build reduces the per-replica batch ---


def _patch_symbolic_build() -> Any:
    """`TensorFlowTrainer._maybe_symbolic_build` takes one local replica's batch.

    Upstream reduces the first distributed batch with `strategy.reduce("MEAN",
    batch, axis=None)` to get example shapes; under MultiWorkerMirroredStrategy that
    reduce cannot take the nested per-replica input and `fit`, `evaluate` and
    `predict` fail before the first step. The batch is only needed for its
    shapes and dtypes, so the first local replica's part serves.
    """
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.TensorFlowTrainer._maybe_symbolic_build

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        strategy = self.distribute_strategy
        peeked = _peeked_generator_batch(iterator)
        if peeked is not None:
            data_batch, iterator = peeked, None
        if iterator is not None:
            # Keras 3.5-3.6 yield (step, it) from enumerate_epoch(); 3.7-3.10 (step, it)
            # from the iterator; 3.11+ (begin, end, it).
            epoch = iterator.enumerate_epoch() if hasattr(iterator, "enumerate_epoch") else iterator
            for *_, it in epoch:
                data_batch = tree.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    next(it),
                )
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    return lambda: setattr(tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build", original)


def _peeked_generator_batch(iterator: Any) -> Any:
    """The first batch Keras peeked from a Python generator, or `None` for other inputs.

    Drawing it from a fresh iterator instead (then resetting) would lose the batches
    tf.data's prefetch pulled from the generator meanwhile, a timing-dependent number:
    workers would then train on halves of different global batches.
    """
    adapter = getattr(iterator, "data_adapter", None)
    if type(adapter).__name__ != "GeneratorDataAdapter":
        return None
    first = getattr(adapter, "_first_batches", None)
    return first[0] if first else None


# --- keras-team/keras#20585 (2/2): scalar logs reduced with axis=0 -----------------


def _patch_reduce_per_replica() -> Any:
    """`reduce_per_replica` averages multi-worker logs element-wise across replicas.

    Upstream calls `strategy.reduce("MEAN", v, axis=0)` under multi-worker mode,
    which fails on the scalar losses and metrics that `train_step` returns (and
    would average over a batch axis for anything else). The mean across
    replicas is `axis=None`.
    """
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(
            strategy
        ):
            return tree.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values
            )
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica
    return lambda: setattr(tf_trainer, "reduce_per_replica", original)


def _symbolic_build_reduces_batch() -> bool | None:
    from keras.src.backend.tensorflow import trainer as tf_trainer

    method = tf_trainer.TensorFlowTrainer.__dict__.get("_maybe_symbolic_build")
    return None if method is None else _source_has(method, "reduce(", '"MEAN"')


def _reduce_per_replica_uses_axis_0() -> bool | None:
    from keras.src.backend.tensorflow import trainer as tf_trainer

    return _source_has(tf_trainer.reduce_per_replica, 'strategy.reduce("MEAN", v, axis=0)')


# --- keras-team/keras#19246: steps_per_execution > 1 under a distributing strategy -----


def distributing(strategy: Any) -> bool:
    """Whether `strategy` spans several replicas or workers (its steps hold collectives)."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    return strategy.num_replicas_in_sync > 1 or tf_trainer._collective_all_reduce_multi_worker(
        strategy)


def strategy_name(strategy: Any) -> str:
    """The public name of `strategy`'s class (TensorFlow's multi-worker class is named otherwise)."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__


def refuse_unsupported_settings(model: Any) -> None:
    """Raises for a compile setting that would not train as on one device under distribution.

    Called when `fit`/`evaluate` build their step function (the first call after
    `compile`) under a strategy that spans replicas or workers.

    Raises:
        ValueError: For `jit_compile=True` (XLA would compile the whole
            multi-replica function: a TensorFlow error on CPU devices, and
            Keras's own `"auto"` turns XLA off under tf.distribute) and for an
            optimizer with `gradient_accumulation_steps` (its all-reduce runs
            inside a `cond`: "merge_call called while defining a new graph").
    """
    strategy = strategy_name(model.distribute_strategy)
    if getattr(model, "_jit_compile", None) is True:
        raise ValueError(
            f"compile(jit_compile=True) is not supported under {strategy}: XLA would compile "
            "the whole multi-replica step (TensorFlow fails: 'Trying to access resource ... "
            "located in device'). Received: jit_compile=True. Use jit_compile='auto' (Keras "
            "turns XLA off under tf.distribute) or jit_compile=False."
        )
    steps = getattr(getattr(model, "optimizer", None), "gradient_accumulation_steps", None)
    if steps:
        raise ValueError(
            f"An optimizer with gradient_accumulation_steps={steps} is not supported under "
            f"{strategy}: Keras all-reduces the gradients inside the accumulation's cond "
            "('merge_call called while defining a new graph'). Use "
            f"gradient_accumulation_steps=None with a {steps}x larger global batch size "
            "(several devices or workers already give a larger batch per update)."
        )


def _patch_steps_per_execution() -> Any:
    """`steps_per_execution > 1` fails under MirroredStrategy and MultiWorkerMirroredStrategy.

    Upstream's `multi_step_on_iterator` runs each step inside a `tf.cond` (guarding
    against an exhausted iterator) inside its `tf.while_loop`. `strategy.run` in
    that cond branch leaves an uncaptured placeholder: "You must feed a value for
    placeholder tensor 'while/cond/Placeholder_1'". The loop's own condition
    already checks that the next input exists and that fewer than N steps ran,
    so under a distributing strategy the step runs unconditionally in the loop
    body; only fetching the next input stays in a `tf.cond` (it must not consume
    a batch beyond the N-th). Other strategies keep upstream's function.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.TensorFlowTrainer._make_function

    def _make_function(self, step_function):
        if not distributing(self.distribute_strategy):
            return original(self, step_function)
        refuse_unsupported_settings(self)
        if self.run_eagerly or self.steps_per_execution == 1:
            return original(self, step_function)
        if getattr(self, "unrolled_steps_per_execution", 1) != 1:
            raise ValueError(
                "unrolled_steps_per_execution > 1 is not supported by keras_mgpu_plugins "
                f"under {strategy_name(self.distribute_strategy)} "
                "(keras-team/keras#19246). Received: "
                f"unrolled_steps_per_execution={self.unrolled_steps_per_execution}; "
                "leave it at 1 (steps_per_execution works)."
            )
        strategy = self.distribute_strategy

        def one_step_on_data(data):
            outputs = strategy.run(step_function, args=(data,))
            return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

        one_step = getattr(self, "_autoconvert_optionals", lambda f: f)(
            tf.function(one_step_on_data, reduce_retracing=True, jit_compile=self.jit_compile))

        def multi_step_on_iterator(iterator):
            n = self.steps_per_execution
            empty = tf.experimental.Optional.empty(None)  # spec set while tracing the body

            def cond(step, outputs, inputs):
                return tf.logical_and(tf.less(step, n), inputs.has_value())

            def body(step, outputs, inputs):
                new = tf.experimental.Optional.from_value(one_step(inputs.get_value()))
                empty._element_spec = new.element_spec
                following = tf.cond(tf.less(step + 1, n), iterator.get_next_as_optional,
                                    lambda: inputs)
                return step + 1, new, following

            _, final, _ = tf.while_loop(
                cond, body, [tf.constant(0), empty, iterator.get_next_as_optional()])
            final._element_spec = empty.element_spec
            return final

        multi_step = tf.function(tf.autograph.experimental.do_not_convert(multi_step_on_iterator),
                                 reduce_retracing=True)

        def function(iterator):
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                outputs = multi_step(iterator)
                if not outputs.has_value():
                    raise StopIteration
                return outputs.get_value()
            for _, data in zip(range(self.steps_per_execution), iterator, strict=False):
                outputs = one_step(data)
            return outputs

        return function

    tf_trainer.TensorFlowTrainer._make_function = _make_function
    return lambda: setattr(tf_trainer.TensorFlowTrainer, "_make_function", original)


def _multi_step_conds_the_step() -> bool | None:
    from keras.src.backend.tensorflow import trainer as tf_trainer

    return _source_has(tf_trainer.TensorFlowTrainer._make_function, "tf.cond(", "has_next",
                       "one_step_on_data(next_optional_inputs.get_value())")


# --- mixed precision: the loss scale's finiteness is one replica's, not the global batch's ---


def _patch_loss_scale_finiteness() -> Any:
    """`LossScaleOptimizer` decides "skip this step" on one replica's local gradients.

    Under tf.distribute Keras's `_tf_apply` checks `isfinite` on the gradients
    before they are all-reduced and takes the first local replica's answer
    ("each replica computed the same value, since grads is all-reduced": they
    are not yet). When another replica overflowed, its inf/NaN gradients are
    all-reduced into every update, and the loss scale collapses; on several
    workers, each takes its own first replica's answer. One device skips the
    step whenever the global batch's gradient overflows. The fix agrees across
    every replica and worker first (one scalar all-reduce) and, if any replica
    overflowed, makes every replica's gradients NaN, so each skips the step
    and halves the scale as one device does. Finite gradients pass unchanged.
    """
    import tensorflow as tf
    from keras.src.optimizers import loss_scale_optimizer as lso

    original = lso.LossScaleOptimizer._tf_apply

    def _tf_apply(self, grads, trainable_variables=None):
        context = tf.distribute.get_replica_context()
        if context is None or not distributing(tf.distribute.get_strategy()):
            return original(self, grads, trainable_variables)
        local_bad = tf.cast(tf.logical_not(self.check_finite(grads)), tf.float32)
        finite = tf.equal(context.all_reduce("SUM", local_bad), 0.0)

        def poison(g):
            if g is None:
                return g
            if isinstance(g, tf.IndexedSlices):
                return tf.IndexedSlices(poison(g.values), g.indices, g.dense_shape)
            return tf.where(finite, g, tf.constant(float("nan"), g.dtype))

        return original(self, [poison(g) for g in grads], trainable_variables)

    lso.LossScaleOptimizer._tf_apply = _tf_apply
    return lambda: setattr(lso.LossScaleOptimizer, "_tf_apply", original)


def _loss_scale_takes_first_replica() -> bool | None:
    from keras.src.optimizers import loss_scale_optimizer as lso

    method = lso.LossScaleOptimizer.__dict__.get("_tf_apply")
    return None if method is None else _source_has(
        method, "experimental_local_results", ")[0]", "check_finite")


# Versions read from the released sources: `_maybe_symbolic_build` first appears
# in 3.5.0; the multi-worker "mean" branch with axis=0 in 3.3.0 (before it,
# "auto" meant a sum with axis=None, which works). Run-tested with 2 workers on
# Keras 3.10 (TensorFlow 2.16 to 2.19) and 3.15 (TensorFlow 2.21); older Keras is
# refused for distribution anyway (`check_keras_for_distribution`).
PATCHES: tuple[Patch, ...] = (
    Patch(
        name="symbolic_build_per_replica_batch",
        upstream="https://github.com/keras-team/keras/issues/20585",
        min_version="3.5.0",
        max_version="3.16.0",
        apply=_patch_symbolic_build,
        present=_symbolic_build_reduces_batch,
    ),
    Patch(
        name="multi_worker_scalar_log_reduce",
        upstream="https://github.com/keras-team/keras/issues/20585",
        min_version="3.3.0",
        max_version="3.16.0",
        apply=_patch_reduce_per_replica,
        present=_reduce_per_replica_uses_axis_0,
    ),
    # The tf.cond around each step of a tf.while_loop: from 3.7.0 (3.3-3.6 loop in Python
    # over single steps); still there in 3.15.
    Patch(
        name="steps_per_execution_under_distribution",
        upstream="https://github.com/keras-team/keras/issues/19246",
        min_version="3.7.0",
        max_version="3.16.0",
        apply=_patch_steps_per_execution,
        present=_multi_step_conds_the_step,
    ),
    # _tf_apply takes the first replica's `finite`: in 3.0.0 already, still in 3.15. No
    # upstream issue found: the upstream field names the code.
    Patch(
        name="loss_scale_global_finiteness",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/optimizers/loss_scale_optimizer.py",
        min_version="3.0.0",
        max_version="3.16.0",
        apply=_patch_loss_scale_finiteness,
        present=_loss_scale_takes_first_replica,
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


def patch_keras() -> list[str]:
    """Applies the Keras workarounds known for the installed version. Idempotent.

    Only the TensorFlow backend is patched; other backends are left untouched.
    A patch applies from its `min_version` (older Keras lacks the code it fixes)
    while the installed Keras still has that code (`Patch.present`). On a Keras
    newer than the versions it was checked for, it applies with one warning if
    the code is still there, and is skipped with one warning if it is gone (an
    upstream fix, or a change to check).

    Returns:
        The names of the patches in force after the call.

    Example:
        >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()
        >>> kmp.compat.patch_keras()
        ['symbolic_build_per_replica_batch', 'multi_worker_scalar_log_reduce']
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return []
    version = keras.__version__
    with _lock:
        for patch in PATCHES:
            if patch.name in _applied or Version(version) < Version(patch.min_version):
                continue
            present = patch.present()
            checked = patch.applies_to(version)
            if present is False or (present is None and not checked):
                _warn_patch(patch, f"Keras {version} no longer has the code it fixes "
                                   f"({'changed' if present is False else 'unreadable'}); not "
                                   "applied. If multi-worker fit fails, please report it.")
                continue
            if not checked:
                _warn_patch(patch, f"Keras {version} still has the code it fixes; applied.")
            _applied[patch.name] = patch.apply()
        return list(_applied)


def _warn_patch(patch: Patch, what: str) -> None:
    import warnings

    key = f"patch:{patch.name}"
    if key not in _warned_patches:
        _warned_patches.add(key)
        warnings.warn(f"kmp.compat patch {patch.name} ({patch.upstream}) is checked for Keras "
                      f">={patch.min_version},<{patch.max_version}; {what}", UserWarning,
                      stacklevel=3)


def unpatch_keras() -> None:
    """Undoes every applied patch (for tests that prove a patch is needed)."""
    with _lock:
        for name in reversed(list(_applied)):
            _applied.pop(name)()


# --- private API: callbacks (initial epoch, monitor direction, messages, dispatch) ---


def set_initial_epoch(model: Any, epoch: int) -> None:
    """Makes the running `fit` start at `epoch`, as Keras's `BackupAndRestore` does.

    Keras's trainers read `model._initial_epoch` right after `on_train_begin`.

    Raises:
        RuntimeError: If this Keras has no such attribute (it would be ignored).
    """
    require("initial_epoch")
    if not hasattr(model, "_initial_epoch"):
        raise RuntimeError(f"{type(model).__name__} has no _initial_epoch: the restored "
                           f"epoch cannot be passed to fit with Keras {keras_version()}.")
    model._initial_epoch = epoch


def resolve_monitor_op(callback: Any) -> None:
    """Sets `callback.monitor_op` to Keras's `ops.less`/`ops.greater` for its `mode`.

    Keras's own inference (`_set_monitor_op`) of `mode="auto"` from the
    monitored name and the model's metrics; it raises `ValueError` as Keras does.

    Raises:
        RuntimeError: If this Keras has no such method (see `require`).
    """
    require("monitor_op")
    callback._set_monitor_op()


def keras_print_msg(message: str) -> None:
    """Prints as Keras's callbacks do: stdout, or absl logging when interactive logging is off.

    Fallback when Keras's `io_utils.print_msg` is gone: the same rule through
    `keras.config.is_interactive_logging_enabled()` and `print`.
    """
    if require("print_msg"):
        importlib.import_module(IO_UTILS).print_msg(message)
        return
    import keras

    if keras.config.is_interactive_logging_enabled():
        print(message, flush=True)
    else:
        logger.info(message)


def set_async_safe(callback: Any, safe: bool) -> None:
    """Tells Keras that `callback`'s batch hooks may run off the training thread.

    Keras (3.6+) dispatches batch hooks asynchronously, on backends it deems
    thread-safe (not TensorFlow, as of 3.15), only if no callback overrides
    them, unless a callback sets `async_safe`. Older Keras ignores it
    (synchronous dispatch: slower, same results).
    """
    require("async_safe")  # warns once where Keras ignores it
    callback.async_safe = bool(safe)


def hide_from_progbar(model: Any, keys: Callable[[], Iterable[str]]) -> Callable[[], None] | None:
    """Removes `keys()` from the epoch `logs` once Keras's `History` has recorded them.

    `fit`'s `CallbackList` appends `History`, then `ProgbarLogger`, after the
    user's callbacks, and sets `model.history` to that `History`: wrapping its
    `on_epoch_end` on the instance lets every user callback and `History` see
    all keys while the progress bar, which runs last, does not.

    Returns:
        A function undoing the wrap; `None` when nothing was wrapped (no
        `History`, or a Keras that orders them otherwise: the progress bar then
        shows every key).
    """
    import keras

    history = getattr(model, "history", None)
    if not isinstance(history, keras.callbacks.History) or not require("progbar_after_history"):
        return None
    original = history.on_epoch_end

    def on_epoch_end(epoch: int, logs: dict | None = None) -> None:
        original(epoch, logs)
        for key in keys():
            if logs is not None:
                logs.pop(key, None)

    history.on_epoch_end = on_epoch_end
    return lambda: history.__dict__.pop("on_epoch_end", None)


def all_layers(model: Any) -> list:
    """Every layer nested in `model` (in sub-models and custom layers' attributes too)."""
    require("flatten_layers")
    return list(model._flatten_layers(include_self=False))


# --- private API: the loss tracker's row count -------------------------------------------


def local_replica_values(strategy: Any, variable: Any) -> tuple:
    """This worker's per-replica components of a Keras variable (TensorFlow backend).

    Public API only: `variable.value` is the backend `tf.Variable` (a
    distributed one under a strategy), split by `strategy.experimental_local_results`.
    """
    return tuple(strategy.experimental_local_results(getattr(variable, "value", variable)))


def loss_tracker_rows(model: Any) -> list[float] | None:
    """Rows Keras's loss tracker counted since its last reset, one value per local replica.

    Keras (3.2+) weights each update of its `"loss"` tracker (a `Mean` in
    `model.metrics`) by the batch's rows, so its `count` counts rows; it is
    reset at each epoch's start.

    Returns:
        The counts, or `None` when there is no loss tracker or this Keras
        counts otherwise (before 3.2 it counts batches): then
        `DeviceMetricsLogger` needs `batch_size=` for samples per second, and
        `WandbLogger` records no measured batch size.
    """
    import numpy as np

    tracker = next((m for m in model.metrics if m.name == "loss" and hasattr(m, "count")), None)
    if tracker is None or not require("loss_tracker_rows"):
        return None
    counts = local_replica_values(model.distribute_strategy, tracker.count)
    return [float(np.asarray(v)) for v in counts]


# --- private API: checkpoint saving internals (ModelCheckpoint async / multi-worker) ------
# Callers check `require("saving_internals")` once before using these (ModelCheckpoint
# does in __init__ with async_save=True, and at train begin with several workers).


class ArchiveNames(NamedTuple):
    """Member names of a `.keras` archive."""

    config: str
    metadata: str
    weights: str
    assets: str


def archive_names() -> ArchiveNames:
    """The member names `model.save("x.keras")` uses."""
    sl = importlib.import_module(SAVING_LIB)
    return ArchiveNames(sl._CONFIG_FILENAME, sl._METADATA_FILENAME, sl._VARS_FNAME_H5,
                        sl._ASSETS_DIRNAME)


def serialize_model_as_json(model: Any) -> tuple[str, str]:
    """The `config.json` and `metadata.json` texts `model.save` writes."""
    return importlib.import_module(SAVING_LIB)._serialize_model_as_json(model)


def save_state_walk(model: Any, weights_store: Any, assets_store: Any = None) -> None:
    """Keras's own save walk over layers, optimizer and variables, into the given stores."""
    importlib.import_module(SAVING_LIB)._save_state(model, weights_store, assets_store, "", set())


def h5_store_class() -> type:
    """Keras's `H5IOStore` (to subclass: the walk accepts only its instances)."""
    return importlib.import_module(SAVING_LIB).H5IOStore


def open_h5_store(path: str, archive: Any = None) -> Any:
    """A writing `H5IOStore` at `path` (inside `archive`, a `zipfile.ZipFile`, if given)."""
    store = h5_store_class()
    return store(path, mode="w") if archive is None else store(path, archive=archive, mode="w")


def open_assets_store(archive: Any) -> Any:
    """A writing assets store (`DiskIOStore`) zipped into `archive` on `close()`."""
    sl = importlib.import_module(SAVING_LIB)
    return sl.DiskIOStore(sl._ASSETS_DIRNAME, archive=archive, mode="w")


def save_model_to_hdf5(model: Any, h5file: Any) -> None:
    """What `model.save("x.h5")` writes, into an open `h5py.File`."""
    importlib.import_module(LEGACY_H5).save_model_to_hdf5(model, h5file, include_optimizer=True)
