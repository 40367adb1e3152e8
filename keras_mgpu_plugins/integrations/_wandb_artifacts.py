"""W&B artifacts of completed checkpoints, built and logged off the training thread.

`wandb.Artifact.add_file` reads the whole file (a copy into W&B's staging
area and an MD5), which on the training thread would undo `async_save`.
`ArtifactQueue.log` only pins the checkpoint's content on the training thread
(a hard link beside it, named as `io.atomic.temp_path` names temporaries, so a
later save to the same path cannot change what is logged), and one background
thread builds and logs the artifacts in order. `wait` (before the run
finishes) lets the queue drain; an error there is logged as a warning, since
a failed upload must not stop training.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any

from keras_mgpu_plugins.integrations._wandb_logic import checkpoint_aliases
from keras_mgpu_plugins.io import atomic

logger = logging.getLogger("keras_mgpu_plugins.integrations.wandb")


def pin(path: Path) -> Path | None:
    """A hard link to the file `path` (its content as of now), or `None` if none can be made."""
    if path.is_dir() or atomic.is_remote(str(path)):
        return None
    link = Path(atomic.temp_path(str(path), "".join(path.suffixes)))
    try:
        os.link(path, link)
    except OSError:  # no hard links on this file system
        return None
    return link


class ArtifactQueue:
    """Logs checkpoints as artifacts of a run, in order, on one background thread."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def log(self, run: Any, payload: dict[str, Any]) -> None:
        """Queues `payload`'s checkpoint for `run` (called on the training thread)."""
        path = Path(payload["path"])
        self._queue.put((run, payload, path, pin(path)))
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._drain, name="kmp-wandb-artifacts",
                                            daemon=True)
            self._thread.start()

    def wait(self) -> None:
        """Blocks until every queued artifact is logged (or failed, with a warning)."""
        self._queue.join()

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                return
            try:
                _log_artifact(*item)
            except Exception:  # noqa: BLE001 - a failed upload must not stop training
                logger.warning("WandbLogger: checkpoint %s could not be logged as an artifact.",
                               item[1]["path"], exc_info=True)
            finally:
                if item[3] is not None:
                    atomic.remove(str(item[3]))
                self._queue.task_done()


def _log_artifact(run: Any, payload: dict[str, Any], path: Path, pinned: Path | None) -> None:
    import wandb

    metadata = {k: payload.get(k) for k in ("epoch", "batch", "monitor", "value", "is_best")}
    artifact = wandb.Artifact(f"model-{run.id}", type="model", metadata=metadata)
    if path.is_dir() and pinned is None:
        artifact.add_dir(str(path))
    else:  # the pinned content, under the checkpoint's own name
        artifact.add_file(str(pinned or path), name=path.name)
    run.log_artifact(artifact, aliases=checkpoint_aliases(payload))
