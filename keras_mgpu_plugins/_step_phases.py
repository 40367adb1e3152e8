"""Where this process's training time goes, step by step: waiting for input, inside the step.

Kept apart from `DeviceMetricsLogger` (which imports Keras) so that the code that reads a
batch and the code that runs a step can report cheaply, whatever the backend:

- `DeviceMetricsLogger` wraps the model's train function for one `fit` (`compat.watch_steps`):
  `step_began()` / `step_ended()` around each call, on the training thread;
- kmp's own input readers (the `PyDataset`s of `inputs`, each process's share of every
  global batch) and TensorFlow's Python inputs (the functions `tf.data` calls for a
  generator or a `PyDataset`, through the registry kmp patches) time each batch they read:
  `reading_input()`;
- `Runtime.all_gather` times each of kmp's collectives between steps (`in_collective()`):
  waiting there for a slower worker (its input check, a stop agreement) is no host work.

`CLOCK.totals` holds cumulative seconds in `FIELDS` order; `DeviceMetricsLogger` copies
them at every batch start (`records.StepTimer`), so a window's phases are differences of
two copies. Input read on the training thread counts inside or outside the step (where the
backend reads it: JAX inside its train function, torch between steps); input read on
another thread (`tf.data`'s, ahead of the step) counts apart: it holds the step back only
when reading a batch takes about as long as the whole step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import numpy as np

#: The cumulative totals, in seconds.
FIELDS = ("step", "input_in_step", "input_between_steps", "input_other_threads",
          "collective_between_steps")
STEP, INPUT_IN, INPUT_OUT, INPUT_OTHER, COLLECTIVE_OUT = range(len(FIELDS))


class PhaseClock:
    """Cumulative seconds inside the step and reading input, of this process.

    Cheap: `step_began`/`step_ended` are two clock reads and three assignments;
    `reading_input` two clock reads and one addition (a lock only off the training thread).
    """

    def __init__(self) -> None:
        self.totals = np.zeros(len(FIELDS))
        self.in_step = False
        self.training_thread: int | None = None
        self.watching = 0  # train functions watched now (0: steps are not timed)
        self._began = 0.0
        self._lock = threading.Lock()

    def step_began(self) -> None:
        self.in_step = True
        self._began = time.perf_counter()

    def step_ended(self) -> None:
        self.totals[STEP] += time.perf_counter() - self._began
        self.in_step = False

    def add_input(self, seconds: float) -> None:
        """`seconds` spent reading one batch on the calling thread."""
        if threading.get_ident() == self.training_thread:
            self.totals[INPUT_IN if self.in_step else INPUT_OUT] += seconds
        else:
            with self._lock:
                self.totals[INPUT_OTHER] += seconds

    @contextlib.contextmanager
    def reading_input(self) -> Iterator[None]:
        """Times the block as input reading (nothing is kept while no step is watched)."""
        if not self.watching:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_input(time.perf_counter() - start)

    @contextlib.contextmanager
    def in_collective(self) -> Iterator[None]:
        """Times the block as a wait for the other workers in one of kmp's collectives (an
        input check, a stop agreement): between steps it is no host work of this worker."""
        if not self.watching or self.in_step or threading.get_ident() != self.training_thread:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[COLLECTIVE_OUT] += time.perf_counter() - start

    def watch(self) -> None:
        """A train function is watched from now on, from the calling (training) thread."""
        self.training_thread = threading.get_ident()
        self.watching += 1

    def unwatch(self) -> None:
        self.watching = max(0, self.watching - 1)
        self.in_step = False


#: The one clock of this process.
CLOCK = PhaseClock()


def phases(deltas: np.ndarray, cycles: np.ndarray) -> np.ndarray:
    """Seconds per phase of each interval: `(intervals, 4)` input, host, compute, input read
    on other threads.

    Args:
        deltas: Differences of `totals` over each interval, `(intervals, len(FIELDS))`.
        cycles: Each interval's wall time (batch start to batch start).

    Input is what the training thread spent reading (inside and between steps); host is
    what it spent outside the step function on anything else (callbacks, Python of the
    loop); compute is the step function's time without the input read inside it (the
    computation, and the wait for the other workers in the step's collectives), with the
    time kmp's collectives between steps waited for the other workers.
    """
    deltas = np.asarray(deltas, dtype=np.float64).reshape(-1, len(FIELDS))
    cycles = np.asarray(cycles, dtype=np.float64).reshape(-1)
    step, inside, between, other, waited = (deltas[:, i] for i in range(len(FIELDS)))
    host = np.clip(cycles - step - between - waited, 0.0, None)
    compute = np.clip(step - inside + waited, 0.0, None)
    return np.stack([inside + between, host, compute, other], axis=1)
