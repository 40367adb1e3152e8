"""`BackupAndRestore`'s stop at a signal: when the workers check, the check, the message.

The signal itself is recorded by `_stop_signals` (the one place a worker handles stop
signals). `Checks` decides where this `fit`'s workers look at it, all at the same steps:

- at a batch's start (`on_train_batch_begin`, which Keras always calls on the training
  thread), at an epoch's end and at the end of `fit`, once a check is due, and once before
  the first step. One process: at every batch's start (reading a variable);
- several workers: one all-gather of `[signal, step seconds, check seconds]` (`agreed`) at
  the due points only: one worker that got a signal is enough, and every worker learns it
  at the same step. The steps until the next check (`next_interval`) are computed by every
  worker from that same gathered vector, so they are the same everywhere: a check costs at
  most `COST_SHARE` of the time between two checks, and checks come at most
  `interval_s` apart (at the step time measured since the last check), or at every step
  where one step takes longer.

The backup of the agreed step is then written, and every worker raises
`errors.TrainingStopped` (exit code 75). A signal is therefore acted on within
`interval_s` (plus the step in flight) at the step times measured, and saved after that
step's backup write.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from keras_mgpu_plugins import _stop_signals
from keras_mgpu_plugins.errors import STOPPED_EXIT_CODE, TrainingStopped

#: The most a check may cost, as a share of the time between two checks.
COST_SHARE = 0.005
#: Seconds between two checks at most, unless told otherwise (`stop_check_interval`).
DEFAULT_INTERVAL_S = 2.0


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


def check_interval(value: Any, grace: float | None) -> float:
    """`stop_check_interval` as seconds, refused where it cannot honour a stop.

    Args:
        value: Seconds between two checks at most (>= 0; 0: at every step).
        grace: The seconds the job gets after a stop signal (`kmp-launch --stop-grace`,
            `KMP_STOP_GRACE`), or `None` where not known.

    Raises:
        ValueError: Naming the value, for a negative or non-number, or one over half the
            grace (the other half is for the step in flight and the backup's write).
    """
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise ValueError(
            "stop_check_interval must be a number of seconds >= 0 (0: check at every step). "
            f"Received: stop_check_interval={value!r}")
    if grace is not None and value > grace / 2:
        raise ValueError(
            f"stop_check_interval={value:g} s cannot honour a stop signal within the job's stop "
            f"grace of {grace:g} s ({_stop_signals.STOP_GRACE_ENV}, kmp-launch --stop-grace): "
            "after a signal the workers take up to one interval to reach their next check, "
            "then the step in flight and the backup's write must fit in what is left. Use "
            f"stop_check_interval <= {grace / 2:g} (half the grace), or a longer grace.")
    return float(value)


def next_interval(step_s: float, cost_s: float, interval_s: float,
                  share: float = COST_SHARE) -> int:
    """Steps from one check to the next: as few as keep a check at most `share` of the time
    between checks, but no more than fit in `interval_s` (at least 1).

    Args:
        step_s: Seconds a step takes (the slowest worker's, measured).
        cost_s: Seconds a check takes (the slowest worker's, measured).
        interval_s: The longest time between two checks.
    """
    if step_s <= 0:
        return 1
    most = max(1, int(interval_s / step_s))
    fewest = max(1, math.ceil(cost_s / (share * step_s)))
    return min(fewest, most)


class Checks:
    """Where this `fit`'s workers check for a stop signal: the same steps on every worker.

    Steps are counted in calls of Keras's train function (batches, or groups of
    `steps_per_execution`) since the `fit` began: every worker makes the same calls.
    """

    def __init__(self, runtime: Any, interval_s: float) -> None:
        self.runtime, self.interval_s = runtime, interval_s
        self.spans = bool(runtime.spans_workers)
        self.begun = 0  # train function calls begun in this fit
        self.trained = 0  # of them, those done at this point
        self.due = 1  # the trained count at which the next check is due
        self.every = 1
        self._since, self._since_trained, self._cost = time.perf_counter(), 0, 0.0
        self._warned = False

    def batch_begins(self) -> bool:
        """At each batch's start: whether to check now (the steps before it trained)."""
        self.trained = self.begun
        self.begun += 1
        return not self.spans or self.trained >= self.due

    def epoch_ends(self) -> bool:
        """At an epoch's end (every step of it trained): whether to check now. At each one
        that trained a step since the last check, due or not: Keras already waits there for
        every worker (the epoch's metrics are read), and a K measured at faster steps (steps
        that grew slower since) would otherwise put the next check far past the interval."""
        self.trained = self.begun
        return not self.spans or self.trained > self._since_trained

    def agreed(self) -> tuple[str, list[int]] | None:
        """The check: whether any worker received a stop signal (its name and the workers
        that received one). Every worker calls it at the same point."""
        if not self.spans:
            return local(self.runtime)
        began = time.perf_counter()  # a watched source's question (Ray's) is part of the cost
        return self.agreed_with(_stop_signals.requested(), began)

    def agreed_with(self, request: _stop_signals.Request | None,
                    began: float | None = None) -> tuple[str, list[int]] | None:
        """`agreed`, with this worker's `request` given (the check itself, across workers);
        `began`: when the check began, where asking for `request` was part of it."""
        now = time.perf_counter()
        began = now if began is None else began
        step_s = (began - self._since) / max(1, self.trained - self._since_trained)
        mine = np.array([0 if request is None else request.signum, round(step_s * 1e6),
                         round(self._cost * 1e6)], np.int64)
        votes = self.runtime.all_gather(mine)
        self._cost = time.perf_counter() - began
        self.every = next_interval(votes[:, 1].max() / 1e6, votes[:, 2].max() / 1e6,
                                   self.interval_s)
        self.due = self.trained + self.every
        self._since, self._since_trained = time.perf_counter(), self.trained
        self._warn_if_costly(votes)
        _stop_signals.plan(self.describe_next)
        receivers = [int(i) for i in np.flatnonzero(votes[:, 0])]
        if not receivers:
            return None
        return _stop_signals.name(int(votes[receivers[0], 0])), receivers

    def describe_next(self) -> str:
        """When the workers check next, for the message a signal prints."""
        if not self.spans:
            return "before the next step"
        step_s = (time.perf_counter() - self._since) / max(1, self.begun - self._since_trained)
        left = max(0, self.due - self.begun)
        return (f"at the workers' next check, in {left} step{'s' if left != 1 else ''} (about "
                f"{left * step_s:.1f} s; they check every {self.every} steps, "
                f"{self.interval_s:g} s apart at most)")

    def _warn_if_costly(self, votes: np.ndarray) -> None:
        step_s, cost_s = votes[:, 1].max() / 1e6, votes[:, 2].max() / 1e6
        if self._warned or not step_s or cost_s <= 2 * COST_SHARE * self.every * step_s:
            return
        self._warned = True
        warnings.warn(
            f"BackupAndRestore: a check for stop signals takes {cost_s * 1e3:.1f} ms across "
            f"the workers, {100 * cost_s / (self.every * step_s):.1f}% of the {self.every} "
            f"steps between two checks (at most stop_check_interval={self.interval_s:g} s "
            "apart). A longer stop_check_interval makes it cheaper (it bounds the time from a "
            "signal to the stop).", UserWarning, stacklevel=2)


def local(runtime: Any) -> tuple[str, list[int]] | None:
    """The check of a `fit` that spans one process: its own signal, if any."""
    request = _stop_signals.requested()
    return None if request is None else (request.name, [runtime.worker_index])


def agreed(runtime: Any) -> tuple[str, list[int]] | None:
    """Whether any worker received a stop signal, at a point every worker reaches together
    (before the first step): one all-gather when `runtime` spans workers (of the vector
    `Checks` gathers, so that collective is ready when the steps begin)."""
    if not runtime.spans_workers:
        return local(runtime)
    request = _stop_signals.requested()
    mine = np.array([0 if request is None else request.signum, 0, 0], np.int64)
    votes = runtime.all_gather(mine)[:, 0]
    receivers = [int(i) for i in np.flatnonzero(votes)]
    if not receivers:
        return None
    return _stop_signals.name(int(votes[receivers[0]])), receivers


def stopped(signal_name: str, receivers: list[int], epoch: int, batches_done: int,
            backup_dir: str, trained: bool, received: bool, finished: bool = False
            ) -> TrainingStopped:
    """The exception every worker raises once the backup holds the agreed step."""
    who = ("worker" if len(receivers) == 1 else "workers") + " " + ", ".join(map(str, receivers))
    if finished:
        where = f"at the end of fit (after epoch {epoch})"
        saved = (f"BackupAndRestore kept its backup of that step in {backup_dir}: the same "
                 "command again skips the finished training and goes on after fit")
    elif trained:
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
