"""`EarlyStopping`: Keras's callback, with one stop decision for every worker."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from keras_mgpu_plugins import collective, compat


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What `StoppingRule.step` concluded about one epoch.

    Attributes:
        monitored: Whether the epoch counted (a value, and past the warm-up).
        improved: Whether the value is the new best (capture the weights).
        stop: Whether patience ran out (stop training).
    """

    monitored: bool = False
    improved: bool = False
    stop: bool = False


class StoppingRule:
    """The early-stopping decision of `keras.callbacks.EarlyStopping`, on numbers.

    No Keras, no model: one value per epoch in, a `Verdict` out. Keras compares
    Python floats at its float precision (`keras.config.floatx()`, float32 by
    default), so two values closer than that precision are equal here too.

    Args:
        mode: `"min"` or `"max"` (already resolved from `"auto"`).
        min_delta: Smallest change that counts as an improvement (its sign is
            ignored, as in Keras).
        patience: Epochs without improvement before stopping.
        baseline: A value to beat; while no epoch beats it, the wait is not
            reset, and training stops after `patience` epochs.
        start_from_epoch: Epochs of warm-up that are not monitored.
        dtype: Precision of the comparisons (a NumPy dtype or its name).

    Example:
        >>> rule = StoppingRule("min", patience=1)
        >>> [rule.step(e, v).stop for e, v in enumerate([3.0, 2.0, 2.5, 2.4])]
        [False, False, False, True]
        >>> rule.best, rule.best_epoch, rule.stopped_epoch
        (2.0, 1, 3)
    """

    def __init__(
        self,
        mode: str,
        min_delta: float = 0.0,
        patience: int = 0,
        baseline: float | None = None,
        start_from_epoch: int = 0,
        dtype: Any = "float32",
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f'mode must be "min" or "max". Received: mode={mode!r}')
        self.mode = mode
        self.min_delta = abs(min_delta)
        self.patience = patience
        self.baseline = baseline
        self.start_from_epoch = start_from_epoch
        self.dtype = np.dtype(dtype)
        self.reset()

    def reset(self) -> None:
        """Forgets every epoch seen (a new `fit`)."""
        self.wait = 0
        self.best: float | None = None
        self.best_epoch = 0
        self.stopped_epoch = 0

    def is_improvement(self, value: float, reference: float | None) -> bool:
        """Whether `value` beats `reference` by more than `min_delta`."""
        if reference is None:
            return True
        if self.mode == "min":
            return bool(self._cast(value + self.min_delta) < self._cast(reference))
        return bool(self._cast(value - self.min_delta) > self._cast(reference))

    def step(self, epoch: int, value: float | None) -> Verdict:
        """Takes the monitored value at the end of `epoch` (`None`: not logged)."""
        if value is None or epoch < self.start_from_epoch:
            return Verdict()
        self.wait += 1
        if self.is_improvement(value, self.best):
            self.best, self.best_epoch = value, epoch
            if self.baseline is None or self.is_improvement(value, self.baseline):
                self.wait = 0
            return Verdict(monitored=True, improved=True)
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            return Verdict(monitored=True, stop=True)
        return Verdict(monitored=True)

    def _cast(self, value: float) -> np.ndarray:
        return np.asarray(value, dtype=self.dtype)


class EarlyStopping(keras.callbacks.EarlyStopping):
    """Stops training when a monitored quantity has stopped improving; worker-safe.

    A drop-in for `keras.callbacks.EarlyStopping` (same arguments, attributes,
    messages and decisions on one device; it is a subclass). With several
    workers, every worker takes the chief's monitored value each epoch
    (`collective.broadcast`), so all of them stop at the same epoch even when
    the value differs between workers (a metric that is not reduced), and none
    is left waiting in a collective. With `restore_best_weights`, every worker
    keeps the weights of the same epoch; synchronous training keeps them
    identical to the bit, on every replica. Messages print on the chief only.
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
        collective.same_settings(  # they decide the stop epoch, hence the collectives run
            {"monitor": self.monitor, "mode": self.mode, "min_delta": float(self.min_delta),
             "patience": self.patience, "baseline": self.baseline,
             "start_from_epoch": self.start_from_epoch,
             "restore_best_weights": bool(self.restore_best_weights)},
            type(self).__name__, getattr(self.model, "distribute_strategy", None),
        )

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.monitor_op is None:
            compat.resolve_monitor_op(self)  # Keras's own inference of mode="auto"
        current = self.get_monitor_value(logs)  # collective: every worker, every epoch
        rule = self._make_rule()  # from the attributes as they are now, as Keras reads them
        verdict = rule.step(epoch, current)
        self.wait, self.best, self.best_epoch = rule.wait, rule.best, rule.best_epoch
        if verdict.improved and self.restore_best_weights:
            self.best_weights = self.model.get_weights()
        if verdict.stop:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs: dict | None = None) -> None:
        with _quiet_unless(collective.is_chief(), self):
            super().on_train_end(logs)  # messages, then restores best_weights

    def get_monitor_value(self, logs: dict | None) -> float | None:
        """The chief's value of `monitor` (this worker's in a single process).

        A collective under a multi-worker strategy: every worker calls it at
        every epoch end, in the same order.
        """
        value = (logs or {}).get(self.monitor)
        strategy = getattr(self.model, "distribute_strategy", None)
        if collective.spans_workers(strategy):
            value = _chief_value(value, strategy)
        if value is None:
            warnings.warn(
                f"Early stopping conditioned on metric `{self.monitor}` which is not "
                f"available. Available metrics are: {','.join(list((logs or {}).keys()))}",
                stacklevel=2,
            )
        return value

    def _make_rule(self) -> StoppingRule:
        minimizing = bool(self.monitor_op(0.0, 1.0))  # ops.less or ops.greater
        rule = StoppingRule(
            mode="min" if minimizing else "max",
            min_delta=self.min_delta,
            patience=self.patience,
            baseline=self.baseline,
            start_from_epoch=self.start_from_epoch,
            dtype=_float_dtype(keras.config.floatx()),
        )
        rule.wait, rule.best, rule.best_epoch = self.wait, self.best, self.best_epoch
        return rule


def _chief_value(value: Any, strategy: Any) -> float | None:
    """Every worker gets the chief's value (`None` if the chief has none)."""
    try:  # never raise before the collective: the other workers would wait for us
        mine = np.array([0.0, 0.0] if value is None else [1.0, float(value)])
    except (TypeError, ValueError):
        mine = np.array([0.0, 0.0])
    present, chief = collective.broadcast(mine, strategy)
    return float(chief) if present else None


def _float_dtype(name: str) -> Any:
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16: NumPy knows it through ml_dtypes
        import ml_dtypes

        return getattr(ml_dtypes, name)


@contextlib.contextmanager
def _quiet_unless(speak: bool, callback: Any) -> Iterator[None]:
    verbose = callback.verbose
    if not speak:
        callback.verbose = 0
    try:
        yield
    finally:
        callback.verbose = verbose
