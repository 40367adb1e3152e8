"""`EarlyStopping`: Keras's callback, with one stop decision for every worker.

Keras's own decision runs; only the value it reads is made the same on every
worker: `get_monitor_value` returns the chief's, so every worker decides alike,
at the same epoch. The best weights are read through the backend
(`_backend.active().host_value`, the arrays `get_weights()` gives), so a
variable sharded over several JAX processes, which `get_weights()` cannot read,
is kept and restored too.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from keras_mgpu_plugins import runtime


class EarlyStopping(keras.callbacks.EarlyStopping):
    """Stops training when a monitored quantity has stopped improving; worker-safe.

    A drop-in for `keras.callbacks.EarlyStopping` (a subclass: its arguments,
    attributes, messages and decision rule are Keras's own). With several
    workers, every worker takes the chief's monitored value each epoch
    (`get_monitor_value` broadcasts it), so all of them stop at the same epoch even when
    the value differs between workers (a metric that is not reduced), and none
    is left waiting in a collective. With `restore_best_weights`, every worker
    keeps the weights of the same epoch; synchronous training keeps them
    identical to the bit, on every replica. Sharded variables (JAX's
    `strategy="model_parallel"` / `"hybrid"`) are kept whole on the host, as
    `get_weights()` gives them (a variable sharded over several processes is
    gathered: every process keeps it), and restored into their own layout,
    each device getting back its shard. Messages print on the chief only.
    Arguments that differ between workers raise `SettingsDifferError` on every
    worker in `on_train_begin`.

    Args:
        monitor: Quantity to be monitored. Defaults to `"val_loss"`.
        min_delta: Minimum change in the monitored quantity to qualify as an
            improvement. Defaults to `0`.
        patience: Number of epochs with no improvement after which training
            is stopped. Defaults to `0`.
        verbose: 0 (silent) or 1 (a message when the callback acts).
        mode: `"auto"`, `"min"` or `"max"`. `"auto"` infers the direction from
            the monitored metric. Defaults to `"auto"`.
        baseline: Value to beat; training stops if no epoch improves on it
            within `patience` epochs. Defaults to `None`.
        restore_best_weights: Whether to restore the weights of the best epoch
            at the end of training. Defaults to `False`.
        start_from_epoch: Number of warm-up epochs that are not monitored.
            Defaults to `0`.

    Raises:
        ValueError: In `fit`, if `mode="auto"` cannot infer the direction of
            `monitor` (as Keras).

    Example:
        >>> stopper = kmp.callbacks.EarlyStopping(monitor="val_loss", patience=3,
        ...                                       restore_best_weights=True)
        >>> model.fit(x, y, validation_data=(vx, vy), epochs=50, callbacks=[stopper])
    """

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)  # resets wait, best, ... (reuse across fits)
        runtime.of(self.model).same_settings(  # they decide the stop epoch, hence the collectives
            {"monitor": self.monitor, "mode": self.mode, "min_delta": float(self.min_delta),
             "patience": self.patience, "baseline": self.baseline,
             "start_from_epoch": self.start_from_epoch,
             "restore_best_weights": bool(self.restore_best_weights)},
            type(self).__name__,
        )

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        keeping = _whole_weights(self.model) if self.restore_best_weights else (
            contextlib.nullcontext())
        with keeping:
            super().on_epoch_end(epoch, logs)  # Keras's decision, and its get_weights()

    def on_train_end(self, logs: dict | None = None) -> None:
        with _quiet_unless(runtime.of(self.model).is_chief, self):
            super().on_train_end(logs)  # messages, then restores best_weights

    def get_monitor_value(self, logs: dict | None) -> float | None:
        """The chief's value of `monitor` (this worker's in a single process).

        A collective under a multi-worker strategy: every worker calls it at
        every epoch end, in the same order.
        """
        value = (logs or {}).get(self.monitor)
        here = runtime.of(self.model)
        if here.spans_workers:
            value = _chief_value(value, here)
        if value is None:
            warnings.warn(
                f"Early stopping conditioned on metric `{self.monitor}` which is not "
                f"available. Available metrics are: {','.join(list((logs or {}).keys()))}",
                stacklevel=2,
            )
        return value

def _chief_value(value: Any, here: runtime.Runtime) -> float | None:
    """Every worker gets the chief's value (`None` if the chief has none)."""
    try:  # never raise before the collective: the other workers would wait for us
        mine = np.array([0.0, 0.0] if value is None else [1.0, float(value)])
    except (TypeError, ValueError):
        mine = np.array([0.0, 0.0])
    present, chief = here.broadcast(mine)
    return float(chief) if present else None


@contextlib.contextmanager
def _whole_weights(model: Any) -> Iterator[None]:
    """During Keras's hook, `model.get_weights()` reads each weight through the backend.

    The same NumPy arrays as Keras's `get_weights()` (`host_value`), and also a
    variable sharded over several processes, which Keras's cannot read (JAX:
    "spans non-addressable devices"): it is gathered, on every process (the
    stop decision is the same everywhere, so every process reads at the same
    epochs). A model class with its own `get_weights` keeps it.
    """
    if type(model).get_weights is not keras.layers.Layer.get_weights or (
            "get_weights" in vars(model)):
        yield
        return
    from keras_mgpu_plugins import _backend

    read = _backend.active().host_value
    vars(model)["get_weights"] = lambda: [read(v) for v in model.weights]  # no Keras tracking
    try:
        yield
    finally:
        del vars(model)["get_weights"]


@contextlib.contextmanager
def _quiet_unless(speak: bool, callback: Any) -> Iterator[None]:
    verbose = callback.verbose
    if not speak:
        callback.verbose = 0
    try:
        yield
    finally:
        callback.verbose = verbose
