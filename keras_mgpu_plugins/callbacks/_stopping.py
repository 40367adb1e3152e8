"""`BackupAndRestore`'s stop at a signal: the agreement on the step, the handlers, the message.

The signal itself is recorded by `_stop_signals` (the one place a worker handles stop
signals). At each of its checks (every batch's end, the epoch's end, and once before the
first step) `BackupAndRestore` runs `agreed`: one all-gather of the signal each worker
received (0: none), so every worker learns at the same step that one of them was told to
stop, and which; one worker that got it is enough, and no worker waits for another that
stopped alone. The backup of that step is then written, and every worker raises
`errors.TrainingStopped` (exit code 75).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from keras_mgpu_plugins import _stop_signals
from keras_mgpu_plugins.errors import STOPPED_EXIT_CODE, TrainingStopped


class Handling:
    """The stop signals of one `fit`: installed and armed at its start, undone at its end."""

    def __init__(self, signums: tuple[int, ...]) -> None:
        self.signums = signums
        self._undo: Callable[[], None] | None = None
        self._armed = False

    def begin(self, owner: str) -> None:
        if not self.signums:
            return
        self.end()  # a fit that raised left them set
        self._undo = _stop_signals.install(self.signums)
        if self._undo is None:
            from keras_mgpu_plugins.integrations import ray as ray_train

            self._undo = ray_train.watch_preemption()  # Ray Train's notice, in its thread
            if self._undo is not None:
                return
            warnings.warn(f"{owner}: fit runs outside the main thread, where Python cannot "
                          "handle signals: a stop signal is not turned into a backup here.",
                          UserWarning, stacklevel=3)
            return
        _stop_signals.arm()
        self._armed = True

    def end(self) -> None:
        if self._armed:
            _stop_signals.disarm()
            self._armed = False
        if self._undo is not None:
            self._undo()
            self._undo = None


def agreed(runtime: Any) -> tuple[str, list[int]] | None:
    """Whether any worker received a stop signal: its name and the workers that received one.

    One all-gather when `runtime` spans workers (every worker calls it at the same step),
    nothing otherwise.
    """
    request = _stop_signals.requested()
    mine = np.array([0 if request is None else request.signum], np.int64)
    votes = runtime.all_gather(mine)[:, 0] if runtime.spans_workers else mine
    receivers = [int(i) for i in np.flatnonzero(votes)]
    if not receivers:
        return None
    return _stop_signals.name(int(votes[receivers[0]])), receivers


def stopped(signal_name: str, receivers: list[int], epoch: int, batches_done: int,
            backup_dir: str, trained: bool, received: bool) -> TrainingStopped:
    """The exception every worker raises once the backup holds the agreed step."""
    who = ("worker" if len(receivers) == 1 else "workers") + " " + ", ".join(map(str, receivers))
    if trained:
        where = (f"in epoch {epoch + 1} (of the progress bar), after {batches_done} of its "
                 "batches" if batches_done else f"at the end of epoch {epoch}")
        saved = f"BackupAndRestore saved that step in {backup_dir}"
    else:
        where = "before the first step"
        saved = (f"nothing was trained since the backup in {backup_dir} (or the start, where "
                 "there is none)")
    message = (f"{_stop_signals.who()}: stopped by {signal_name} (received by {who}) {where}; "
               f"{saved}: run the same command again to resume (exit code "
               f"{STOPPED_EXIT_CODE}).")
    return TrainingStopped(message, signal=signal_name, saved=True, code=STOPPED_EXIT_CODE,
                           epoch=epoch, batches_done=batches_done, backup_dir=backup_dir,
                           received=received)
