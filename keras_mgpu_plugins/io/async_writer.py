"""Who writes a checkpoint, when, and how its failure reaches every worker.

The one scheme of every save (`ModelCheckpoint`, `BackupAndRestore`):

1. every worker takes the same `Snapshot` of the model on its training thread
   (`snapshots.take_snapshot`: reads, no copy where the backend allows);
2. only the chief writes it: at once on the training thread, or with
   `async_save=True` on one background thread, at most one write in flight;
3. an error reaches every worker, with its cause: a synchronous save is one
   `Runtime.together` (every worker's error text travels in one all-gather); a
   background write's error is carried by the chief to every worker at the
   next check (`raise_chief_error`), in the collective that check runs anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from keras_mgpu_plugins.io.snapshots import Snapshot, take_snapshot
from keras_mgpu_plugins.runtime import PeerFailedError, Runtime, decode_error, encode_error


class BackgroundWriter:
    """Runs one job at a time on a background thread and keeps its outcome.

    `submit` waits for the previous job first, so at most one is in flight.
    Outcomes `(record, error)` are collected on the training thread with
    `collect`; nothing is raised or published from the writer thread.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._done: list[tuple[Any, BaseException | None]] = []

    def submit(self, job: Callable[[], Any], record: Any) -> None:
        """Waits for the job in flight, then starts `job` in the background."""
        self.wait()

        def run() -> None:
            error = None
            try:
                job()
            except BaseException as err:  # handed to the training thread
                error = err
            with self._lock:
                self._done.append((record, error))

        # Not a daemon: a checkpoint being written is finished before exit.
        self._thread = threading.Thread(target=run, name="kmp-checkpoint-writer")
        self._thread.start()

    def wait(self) -> None:
        """Blocks until no job is in flight."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def busy(self) -> bool:
        """Whether a job is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def has_news(self) -> bool:
        """Whether a job finished since the last `collect` (cheap, lock-free)."""
        return bool(self._done)

    def collect(self) -> list[tuple[Any, BaseException | None]]:
        """The `(record, error)` of every job finished since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done


class ChiefWrites:
    """A callback's saves: every worker snapshots, the chief writes; errors for all.

    Args:
        owner: The callback's class name, for messages.
        async_save: Write on a background thread.
        on_saved: Called on the chief's training thread with the `record` of
            each complete write.
    """

    def __init__(self, owner: str, async_save: bool, on_saved: Callable[[Any], None]) -> None:
        self.owner = owner
        self.writer = BackgroundWriter() if async_save else None
        self.on_saved = on_saved
        self.error: BaseException | None = None  # the chief's writer error, until raised
        self.since: int | None = None  # epoch of the write in flight

    def save(self, model: Any, kind: str, write: Callable[[Snapshot], None], record: Any,
             what: str, runtime: Runtime, epoch: int) -> None:
        """Every worker snapshots `model`; the chief calls `write(snapshot)`, now or later."""

        def here() -> bool:
            snapshot = take_snapshot(model, kind)  # the same reads on every worker
            if not runtime.is_chief:
                return False
            if self.writer is None:
                write(snapshot)
                return True
            self.writer.submit(lambda: write(snapshot), record)
            self.since = epoch
            return False

        if runtime.together(here, f"{self.owner}: {what}"):
            self.on_saved(record)

    def drain(self, wait: bool = False) -> None:
        """Hands finished background writes to `on_saved`; keeps the first error."""
        if self.writer is None:
            return
        if wait:
            self.writer.wait()
            self.since = None
        for record, error in self.writer.collect():
            if error is None:
                self.on_saved(record)
            elif self.error is None:
                if hasattr(error, "add_note"):  # Python 3.11+
                    error.add_note(f"Raised in {self.owner}'s background writer while "
                                   f"saving {record['path']} (async_save=True).")
                self.error = error

    def check(self, runtime: Runtime, wait: bool) -> None:
        """Raises the chief's writer error on every worker (one broadcast across workers)."""
        self.drain(wait=wait)
        chief = encode_error(self.error if runtime.is_chief else None)
        if runtime.spans_workers:
            chief = runtime.broadcast(chief)
        self.raise_chief_error(chief, runtime)

    def raise_chief_error(self, chief: np.ndarray, runtime: Runtime) -> None:
        """Raises here the error the chief encoded (`encode_error`) in `chief`, if any."""
        cause = decode_error(chief)
        if cause is None:
            return
        error, self.error = self.error, None
        if error is not None and runtime.is_chief:
            raise error
        raise PeerFailedError(
            f"{self.owner}(async_save=True): the chief's background writer failed ({cause}). "
            "Every worker stops here."
        )
