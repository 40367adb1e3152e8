"""One W&B run through preemption: `WandbLogger`'s run id kept beside the job's backup.

A job stopped by a signal (exit 75) and run again, or restarted by `kmp-launch
--max-restarts`, resumes from the backup of its `kmp.callbacks.BackupAndRestore`
(`backup_dir`, announced on the model: `events.announced(model, "backup_dir")`). The
logger keeps `RECORD_NAME` there: the run's id and the last step it logged. The resumed
`fit` opens the same run (`wandb.init(id=..., resume="allow")`) and logs no step at or
before that one again, so the run's steps stay monotonic. The backup folder is removed
when training completes, and the record with it: the next job starts a new run.
Without `BackupAndRestore` a restarted job starts over, and so does its run.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any, NamedTuple

import numpy as np

from keras_mgpu_plugins.callbacks import events
from keras_mgpu_plugins.integrations._wandb_logic import format_group_id
from keras_mgpu_plugins.io import atomic

RECORD_NAME = "wandb_run.json"


class Resume(NamedTuple):
    """Where the record is, the run's id, and the last step already logged (-1: none)."""

    path: str
    run_id: str
    last_step: int

    def save(self, step: int) -> None:
        """Records the last step logged (the chief; atomic, beside the backup)."""
        body = json.dumps({"id": self.run_id, "step": int(step)})
        atomic.write_bytes_atomic(self.path, body.encode("utf-8"))


def read(path: str) -> dict[str, Any] | None:
    """The record at `path` (`None`: none, or not one of ours)."""
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not str(found.get("id", "")).startswith("kmp-"):
        return None
    return found


def agreed(model: Any, runtime: Any, mode: str, init_kwargs: dict[str, Any]) -> Resume | None:
    """The run this `fit` logs to, read from (or first written to) the backup's record.

    `None` where nothing is kept: no `BackupAndRestore` in the `fit`, or an `id` of the
    user's own in `init_kwargs`. In `"group"` mode the chief's record is broadcast (one
    collective, on every worker alike); in `"chief"` mode only the chief reads it.
    """
    backup_dir = events.announced(model, "backup_dir")
    if not backup_dir or init_kwargs.get("id") is not None:
        return None
    path = os.path.join(os.fspath(backup_dir), RECORD_NAME)
    found = read(path) if runtime.is_chief else None
    if found is not None:
        base, step = int(found["id"][4:20], 16), int(found.get("step", -1))
    else:
        base, step = secrets.randbits(62), -1
    if mode == "group":
        base, step = (int(v) for v in runtime.broadcast(np.array([base, step], np.int64)))
    elif not runtime.is_chief:
        return None
    run_id = format_group_id(base)
    if mode == "group":
        run_id = f"{run_id}-w{runtime.worker_index}"
    return Resume(path, run_id, step)
