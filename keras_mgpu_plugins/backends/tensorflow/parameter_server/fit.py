"""`model.fit` under parameter servers: Keras's loop, its steps sent to the workers.

Keras 3's `fit` cannot run under `ParameterServerStrategy` (keras-team/keras#18624).
For a model built in that strategy's scope, `kmp.compat`'s `parameter_server_methods`
runs `fit` here instead, with the same arguments and callbacks:

- the chief builds every variable first (on the parameter servers), then per epoch
  sends `ceil(steps / steps_per_execution)` closures to the workers (`steps`), each
  running the model's own `train_step` on its batches (`data`), and gives Keras's
  `CallbackList` (History, the progress bar, kmp's and the user's callbacks) each
  closure's logs, in order, as they come back: callbacks run on the chief;
- the epoch's logs are the metrics read from the parameter servers once every closure of
  the epoch is done (every worker's steps count), then `validation_data` is evaluated on
  the chief (`inline`), as Keras's `fit` does;
- a worker lost mid-epoch costs no step: the coordinator runs its closures again on the
  other workers (the chief reads their logs once they ran again, `steps.logs_of`), and
  sends it new ones once it is back.

The workers train asynchronously: each step reads the variables as they are when it
starts, while other workers update them (stale gradients, docs/parameter_server.md).
With one worker every step sees the previous one's update: it trains as one device.
"""

from __future__ import annotations

import math
from typing import Any

from keras_mgpu_plugins.backends.tensorflow.parameter_server import data as _data
from keras_mgpu_plugins.backends.tensorflow.parameter_server import steps as _steps
from keras_mgpu_plugins.backends.tensorflow.parameter_server.cluster import (
    coordinator_of,
    num_workers,
)
from keras_mgpu_plugins.backends.tensorflow.patches import ps_trainer as _private


def fit(model: Any, keras_fit: Any, x: Any = None, y: Any = None, batch_size: int | None = None,
        epochs: int = 1, verbose: Any = "auto", callbacks: Any = None,
        validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
        class_weight: Any = None, sample_weight: Any = None, initial_epoch: int = 0,
        steps_per_epoch: int | None = None, validation_steps: int | None = None,
        validation_batch_size: int | None = None, validation_freq: Any = 1) -> Any:
    """`keras.Model.fit` of a parameter-server model (arguments as Keras's). Returns History."""
    import keras

    strategy = _private.strategy_of(model)
    check_model(model, "fit")
    check_callbacks(callbacks)
    if validation_split and validation_data is None:
        (x, y, sample_weight), validation_data = _split(x, y, sample_weight, validation_split)
    coordinator = coordinator_of(strategy)
    source = _data.make(coordinator, x, y, sample_weight, batch_size, shuffle, class_weight,
                        steps_per_epoch)
    _private.build_in_scope(model, strategy, source.element())
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=verbose != 0, verbose=verbose,
            epochs=epochs, steps=source.steps, model=model)
    closure = _closure(model, strategy, source)
    spe = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    window = _steps.Window(coordinator, num_workers(), callbacks.on_train_batch_end)
    model.stop_training = False
    callbacks.on_train_begin()
    training_logs = None
    for epoch in range(_private.initial_epoch(model, initial_epoch), epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        logs = _run_epoch(model, callbacks, window, closure, source, spe)
        epoch_logs = dict(_metrics_or_logs(model, logs))
        if validation_data is not None and _should_eval(epoch, validation_freq):
            val_x, val_y, val_weight = _unpack(validation_data)
            val_logs = model.evaluate(x=val_x, y=val_y, sample_weight=val_weight,
                                      batch_size=validation_batch_size or batch_size,
                                      steps=validation_steps, callbacks=callbacks,
                                      return_dict=True)
            epoch_logs.update({f"val_{name}": value for name, value in val_logs.items()})
        callbacks.on_epoch_end(epoch, epoch_logs)
        training_logs = epoch_logs
        if model.stop_training:
            break
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end(logs=training_logs)
    return model.history


def _run_epoch(model: Any, callbacks: Any, window: Any, closure: Any, source: Any,
               spe: int) -> dict:
    """Sends one epoch's closures and waits for them; the logs of the last one."""
    try:
        for begin in range(0, source.steps, spe):
            count = min(spe, source.steps - begin)
            callbacks.on_train_batch_begin(begin)
            window.send(closure, source.args(count), begin + count - 1)
            if model.stop_training:
                break
        return window.drain()
    except BaseException:
        window.abandon()
        raise


def train_on_batch(model: Any, keras_method: Any, x: Any, y: Any = None, sample_weight: Any = None,
                   class_weight: Any = None, return_dict: bool = False) -> Any:
    """`keras.Model.train_on_batch` of a parameter-server model: one closure on a worker."""
    strategy = _private.strategy_of(model)
    check_model(model, "train_on_batch")
    source = _data.make(coordinator_of(strategy), x, y, sample_weight, None, False,
                        class_weight, None)
    if not isinstance(source, _data.ArrayInput):
        raise ValueError("train_on_batch takes one batch of NumPy arrays (or tensors). "
                         f"Received: x of type {type(x).__name__}")
    source.batch_size, source.steps = len(_data._first(source.data)), 1
    _private.build_in_scope(model, strategy, source.element())
    model.reset_metrics()
    coordinator = coordinator_of(strategy)
    logs = _steps.logs_of(coordinator, coordinator.schedule(_closure(model, strategy, source),
                                                            args=source.args(1)))
    logs = dict(_metrics_or_logs(model, logs))
    return logs if return_dict else _in_order(model, logs)


def check_model(model: Any, method: str) -> None:
    """Raises for a model kmp cannot send to the workers as it is."""
    if not model.compiled:
        raise ValueError(f"You must call `compile()` before using the model (model.{method} "
                         "under parameter servers).")
    replicas = _private.strategy_of(model).num_replicas_in_sync
    if replicas > 1:
        raise ValueError(
            f"Under parameter servers kmp runs one replica per worker, but each worker has "
            f"{replicas} GPUs. Received: {replicas} GPUs per worker. Give each worker one GPU "
            "(CUDA_VISIBLE_DEVICES), and start one worker per GPU.")


def check_callbacks(callbacks: Any) -> None:
    """Raises for a callback that needs every worker to take part (none does under parameter
    servers: only the chief runs fit)."""
    for callback in getattr(callbacks, "callbacks", callbacks) or ():
        reason = getattr(callback, "needs_every_worker", None)
        if reason:
            raise ValueError(
                f"{type(callback).__name__} needs every worker to take part in fit ({reason}), "
                "but under parameter servers only the chief runs fit: the workers run the "
                "steps it sends them, and the variables live once, on the parameter servers. "
                f"Received: callbacks=[..., {type(callback).__name__}(...), ...]. Remove it; "
                "it applies to strategy='mirrored' and 'multi_worker'.")


def _closure(model: Any, strategy: Any, source: Any) -> Any:
    """The step function of `source`'s kind, made once per model and kind (one trace)."""
    cache = model.__dict__.setdefault("_kmp_ps_closures", {})
    key = (type(source).__name__, id(source) if isinstance(source, _data.ArrayInput) else None)
    if key not in cache:
        if isinstance(source, _data.ArrayInput):
            cache.clear()  # the arrays are in the function: one per input
        cache[key] = _steps.train_closure(model, strategy, source)
    return cache[key]


def _metrics_or_logs(model: Any, logs: dict) -> dict:
    """The metrics read from the parameter servers (every step of every worker counted) when
    the steps log the model's metrics; a custom `train_step`'s own logs otherwise."""
    metrics = model.get_metrics_result()
    return metrics if isinstance(logs, dict) and set(logs) == set(metrics) else logs


def _should_eval(epoch: int, freq: Any) -> bool:
    if isinstance(freq, int):
        return (epoch + 1) % freq == 0
    if isinstance(freq, list):
        return epoch + 1 in freq
    raise ValueError(f"Expected `validation_freq` to be a list or int. Received: "
                     f"validation_freq={freq} of the type {type(freq)}.")


def _unpack(validation_data: Any) -> tuple:
    """`(x, y, sample_weight)` for `evaluate`; a dataset function is called on the chief."""
    import tensorflow as tf

    if isinstance(validation_data, (tuple, list)):
        return tuple(validation_data) + (None,) * (3 - len(validation_data))
    if callable(validation_data) and not isinstance(validation_data, tf.data.Dataset):
        validation_data = validation_data()
    return (validation_data, None, None)


def _split(x: Any, y: Any, sample_weight: Any, split: float) -> tuple:
    """Keras's `validation_split`: the last `split` of the rows (NumPy inputs only)."""
    import keras

    if not all(hasattr(a, "shape") for a in keras.tree.flatten((x, y, sample_weight))
               if a is not None):
        raise ValueError("validation_split applies to NumPy arrays (or tensors) only. "
                         f"Received: validation_split={split}, x of type {type(x).__name__}. "
                         "Pass validation_data instead.")
    rows = len(keras.tree.flatten(x)[0])
    cut = int(math.floor(rows * (1.0 - split)))

    def part(value: Any, rows: slice) -> Any:
        return None if value is None else keras.tree.map_structure(lambda a: a[rows], value)

    train = tuple(part(v, slice(0, cut)) for v in (x, y, sample_weight))
    return train, tuple(part(v, slice(cut, None)) for v in (x, y, sample_weight))


def _in_order(model: Any, logs: dict) -> Any:
    """`train_on_batch`'s list of values in the order of `model.metrics_names` (as Keras)."""
    names = [n for n in model.metrics_names if n in logs]
    values = [logs[n] for n in names] + [logs[k] for k in sorted(logs) if k not in names]
    return values[0] if len(values) == 1 else values
