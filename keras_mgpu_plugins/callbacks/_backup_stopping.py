"""How `BackupAndRestore` stops at a signal: the checks in its hooks, the saved stop.

A mixin of `BackupAndRestore` (its attributes: `model`, `backup_dir`, `async_save`,
`stop_check_interval`, `_signals`, `_saves`, the resume counters, `_backup`): the stopping
part of the callback. When and how the workers check is `_stopping.Checks`; the stop is
raised where every worker runs the same check, so every worker stops there or none does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins import _stop_signals, runtime
from keras_mgpu_plugins.callbacks import _stopping


class Stopping:
    """The checks at a batch's start, an epoch's end and `fit`'s end; the stop itself."""

    model: Any
    backup_dir: str
    async_save: bool
    stop_check_interval: float
    _signals: _stopping.Handling
    _saves: Any
    _checks: _stopping.Checks | None
    _current_epoch: int
    _batches_done: int
    _backed_up: tuple[int, int] | None
    _backup: Callable[[], None]
    _undo_skip: Callable[[], None]

    def _begin_checks(self) -> None:
        """At `fit`'s start, its handlers armed and the backup restored: this fit's checks,
        and the first one (a signal before the first step stops before training)."""
        here = runtime.of(self.model)
        self._checks = (_stopping.Checks(here, self.stop_check_interval)
                        if self._signals.signums else None)
        if self._checks is not None:
            _stop_signals.plan(self._checks.describe_next)
            self._stop_if(_stopping.agreed(here), trained=False)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        # Keras calls it on the training thread, before the batch: the steps before it
        # are trained, and every worker is at the same one (`_stopping.Checks`). Batches
        # drawn and dropped on resume have no hooks.
        if self._checks is not None and self._checks.batch_begins():
            self._batches_done = batch
            self._stop_if(self._checks.agreed())

    def _check_at_epoch_end(self) -> None:
        if self._checks is not None and self._checks.epoch_ends():
            self._stop_if(self._checks.agreed())

    def _check_at_train_end(self) -> None:
        """A signal since the last check: the training is done; its backup is kept."""
        if self._checks is not None:
            self._stop_if(self._checks.agreed(), finished=True)

    def _stop_if(self, found: tuple[str, list[int]] | None, trained: bool = True,
                 finished: bool = False) -> None:
        """Every worker stops here, the backup written, if the check `found` a stop signal."""
        if found is None:
            return
        here = runtime.of(self.model)
        if trained and self._backed_up != (self._current_epoch, self._batches_done):
            self._backup()  # (not written already at this very step)
        if self.async_save:
            self._saves.check(here, wait=True)
        self._undo_skip()
        self._signals.end()
        self._checks = None
        error = _stopping.stopped(*found, epoch=self._current_epoch,
                                  batches_done=self._batches_done, backup_dir=self.backup_dir,
                                  trained=trained, received=here.worker_index in found[1],
                                  finished=finished)
        _stop_signals.say(error.message)
        raise error
