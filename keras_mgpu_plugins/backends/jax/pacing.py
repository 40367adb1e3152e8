"""One train step in flight on JAX, so that the time between two steps is the devices' pace.

JAX dispatches asynchronously: Keras's train function returns as soon as the step is
enqueued, and a `fit` without a callback that reads the logs every batch (`verbose=0` or
2, no progress bar) enqueues a whole epoch before the first step has run (measured on CPU,
JAX 0.10: 10 steps of 1.2 s each enqueued 0.2 ms apart, the epoch's time all at its end).
Timed there, steps read as fast as Python can enqueue them, and MFU above 100%.

`OneInFlight` waits, after enqueuing step k+1, for step k's logs: the devices always have
the next step queued (the overlap of the host's dispatch with their work is kept), and the
host never runs more than one step ahead, so the time between two batch starts is a step's
time on the devices. Only the logs are held (the state may be donated to the next step).
"""

from __future__ import annotations

from typing import Any


class OneInFlight:
    """Called with each train function's result; returns once the step before it is done."""

    def __init__(self) -> None:
        self._previous: Any = None

    def __call__(self, result: Any) -> None:
        import jax

        previous = self._previous
        self._previous = result[0] if isinstance(result, tuple) and result else None
        if previous is not None:
            jax.block_until_ready(previous)

    def clear(self) -> None:
        self._previous = None
