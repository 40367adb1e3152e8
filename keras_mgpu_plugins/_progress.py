"""This process's training progress, for `kmp.callbacks.StallWatchdog`.

Kept apart from the callback (which imports Keras) so that any module can report
progress cheaply: `kmp.collective` notes a collective entered and left, the
watchdog's hooks note batches, epochs and evaluations.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class Clock:
    """Last progress (monotonic time), how many so far, and the `paused` blocks open."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.count = 0
        self.paused: list[str] = []

    def touch(self) -> None:
        self.last = time.monotonic()


clock = Clock()


def note_progress() -> None:
    """Records progress of this worker (cheap: two assignments, no lock)."""
    clock.last = time.monotonic()
    clock.count += 1


@contextlib.contextmanager
def paused(what: str) -> Iterator[None]:
    """Pauses this worker's stall clock while the block runs (a long write, a download)."""
    clock.paused.append(what)
    try:
        yield
    finally:
        clock.paused.remove(what)
        note_progress()
