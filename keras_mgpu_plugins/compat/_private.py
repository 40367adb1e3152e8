"""Helpers over private Keras API for the callbacks, `parallelize` and the checkpoint writers.

The rest of the package touches no Keras internal: it calls these (through
`kmp.compat`). Each one calls `require(name)` for the `PrivateUse` it relies on
(`compat._private_uses.PRIVATE_USES`), which checks that Keras still has it and
applies the documented fallback or raises outside the known versions.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import keras_version, require

logger = logging.getLogger("keras_mgpu_plugins")


# --- private API: callbacks (initial epoch, messages, dispatch) ---


def jax_initialize_rng() -> bool:
    """Keras's `initialize_rng` after `jax.distributed.initialize` (one seed on every process).

    Returns:
        Whether it ran (`False`: Keras moved it; the caller agrees on a seed itself).
    """
    if not require("jax_initialize_rng"):
        return False
    resolve("jax distribution_lib").initialize_rng()
    return True


def jax_trainer_module() -> Any:
    """Keras's JAX trainer module (its `_distribute_data` lays out every batch).

    Raises:
        RuntimeError: Keras no longer has it where it is known (`require`).
    """
    require("jax_distribute_data")
    return resolve("jax trainer module")


def jax_relayout(variable: Any, layout: Any) -> None:
    """Lays `variable` (a Keras JAX variable made outside a distribution) out as `layout`, as
    Keras does for one created under it; its value is kept.

    Raises:
        RuntimeError: Keras no longer lays variables out that way (`require`).
    """
    require("jax_variable_relayout")
    variable._layout = layout
    variable._direct_assign(variable.value)


def jax_coordination_client() -> Any:
    """The client of `jax.distributed`'s coordination service (its key-value store), or `None`
    where the installed JAX does not have it as known (one warning)."""
    if not require("jax_coordination_client"):
        return None
    return resolve("jax distributed").global_state.client


def tf_coordination_context() -> Any:
    """TensorFlow's eager context, whose `set_config_key_value` / `get_config_key_value` reach
    the key-value store of the coordination service the multi-worker strategy started; `None`
    where the installed TensorFlow does not have them as known (one warning) or no coordination
    service is configured in this process."""
    if not require("tf_coordination_store"):
        return None
    context = resolve("eager context").context()
    return context if context.coordination_service is not None else None


def jax_backends_started() -> bool:
    """Whether JAX's backends are initialised (`True` where that cannot be known)."""
    if not require("jax_backends_started"):
        return True
    return bool(resolve("jax xla_bridge").backends_are_initialized())


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


def checkpoint_reports_finished_saves() -> bool:
    """Whether Keras's `ModelCheckpoint` prints "finished saving model to ..." after a save.

    Keras 3.15 does (verbose > 0); Keras 3.10 does not. Read from the source of
    the installed Keras's `ModelCheckpoint._save_model` (private use
    `"model_checkpoint_hooks"`); where it cannot be read, the newer message.
    """
    return _reports_finished_saves(keras_version())


@functools.cache
def _reports_finished_saves(version: str) -> bool:
    import keras

    save = getattr(keras.callbacks.ModelCheckpoint, "_save_model", None)
    return source_has(save, "finished saving model") is not False


def keras_print_msg(message: str) -> None:
    """Prints as Keras's callbacks do: stdout, or absl logging when interactive logging is off.

    Fallback when Keras's `io_utils.print_msg` is gone: the same rule through
    `keras.config.is_interactive_logging_enabled()` and `print`.
    """
    if require("print_msg"):
        resolve("io_utils").print_msg(message)
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
    from keras_mgpu_plugins.compat import _registry

    if not _registry.apply_to("progbar_hidden_keys", history, keys):
        return None
    return lambda: _registry.remove_from("progbar_hidden_keys", history)


def wrap_history_epoch_end(history: Any, keys: Callable[[], Iterable[str]]) -> None:
    """The registered per-instance patch `progbar_hidden_keys` (see `hide_from_progbar`)."""
    original = history.on_epoch_end

    def on_epoch_end(epoch: int, logs: dict | None = None) -> None:
        original(epoch, logs)
        for key in keys():
            if logs is not None:
                logs.pop(key, None)

    history.on_epoch_end = on_epoch_end


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


def rows_countable() -> bool:
    """Whether `loss_tracker_rows` can count rows on this Keras backend.

    Not on JAX: its trainer updates the loss tracker outside `train_step` (where the
    private use is checked), and each process counts the global batch.
    """
    import keras

    return keras.backend.backend() != "jax"


def loss_tracker_rows(model: Any) -> list[float] | None:
    """Rows Keras's loss tracker counted since its last reset, one value per local replica.

    Keras (3.2+) weights each update of its `"loss"` tracker (a `Mean` in
    `model.metrics`) by the batch's rows, so its `count` counts rows; it is
    reset at each epoch's start.

    Returns:
        The counts, or `None` when there is no loss tracker, this Keras
        counts otherwise (before 3.2 it counts batches), or the backend is JAX
        (its trainer updates the tracker outside `train_step`, and each process
        counts the global batch): then
        `DeviceMetricsLogger` needs `batch_size=` for samples per second, and
        `WandbLogger` records no measured batch size.
    """
    import numpy as np

    if not rows_countable():
        return None
    tracker = next((m for m in model.metrics if m.name == "loss" and hasattr(m, "count")), None)
    if tracker is None or not require("loss_tracker_rows"):
        return None
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow's trainer only
    counts = (tracker.count,) if strategy is None else local_replica_values(strategy,
                                                                             tracker.count)
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
    sl = resolve("saving_lib")
    return ArchiveNames(sl._CONFIG_FILENAME, sl._METADATA_FILENAME, sl._VARS_FNAME_H5,
                        sl._ASSETS_DIRNAME)


def serialize_model_as_json(model: Any) -> tuple[str, str]:
    """The `config.json` and `metadata.json` texts `model.save` writes."""
    return resolve("saving_lib")._serialize_model_as_json(model)


def save_state_walk(model: Any, weights_store: Any, assets_store: Any = None) -> None:
    """Keras's own save walk over layers, optimizer and variables, into the given stores."""
    resolve("saving_lib")._save_state(model, weights_store, assets_store, "", set())


def h5_store_class() -> type:
    """Keras's `H5IOStore` (to subclass: the walk accepts only its instances)."""
    return resolve("saving_lib").H5IOStore


def open_h5_store(path: str, archive: Any = None) -> Any:
    """A writing `H5IOStore` at `path` (inside `archive`, a `zipfile.ZipFile`, if given)."""
    store = h5_store_class()
    return store(path, mode="w") if archive is None else store(path, archive=archive, mode="w")


def open_assets_store(archive: Any) -> Any:
    """A writing assets store (`DiskIOStore`) zipped into `archive` on `close()`."""
    sl = resolve("saving_lib")
    return sl.DiskIOStore(sl._ASSETS_DIRNAME, archive=archive, mode="w")


def save_model_to_hdf5(model: Any, h5file: Any) -> None:
    """What `model.save("x.h5")` writes, into an open `h5py.File`."""
    resolve("legacy h5 format").save_model_to_hdf5(model, h5file, include_optimizer=True)
