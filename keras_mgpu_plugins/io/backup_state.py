"""The pure parts of `BackupAndRestore`: which backup is whole, which one to restore,
and whether every worker sees the chief's.

Write order (the chief, `BackupAndRestore._write`): the new weights go to a
temporary file; the metadata (naming the SHA-256 of those weights, and the
record of the backup on disk before) replaces the old metadata; then the
weights replace the old weights. Killed before the metadata is replaced, the
previous backup is intact; between the two replacements, the metadata's
`previous` record describes the weights still on disk; after, the new backup
is whole. Killed during the very first backup (metadata without weights and no
previous record), there is no backup: training starts from scratch, with a
warning (`INCOMPLETE`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import numpy as np

#: A backup whose files do not agree with each other (torn, truncated, edited).
CORRUPT = "corrupt"
#: A first backup interrupted before its weights were in place: no backup.
INCOMPLETE = "incomplete"
#: The files of the latest backup in `backup_dir` (Keras's names); the previous one adds `.bkp`.
WEIGHTS_NAME, METADATA_NAME = "latest.weights.h5", "training_metadata.json"


class BackupNotSharedError(RuntimeError):
    """Workers see different backups: `backup_dir` is not on shared storage."""


class BackupMismatchError(ValueError):
    """The backup cannot resume this `fit`: written by another model or optimizer, for
    other data, or by a number of workers this one cannot continue from."""


@dataclasses.dataclass(frozen=True)
class BackupState:
    """A restorable training state: a weights file and where training stood.

    Attributes:
        epoch: First epoch to run after restoring, or `None` for a weights file
            without metadata (Keras then loads the weights and keeps the epoch).
        batch: Last batch seen in that epoch when saved mid-epoch, else 0 (Keras's field).
        digest: SHA-256 (hex) of the weights file.
        batches_done: Batches of `epoch` already trained (a mid-epoch backup: the
            resumed `fit` skips them); 0 for an epoch's end, and for a backup
            Keras wrote (Keras restarts the epoch).
        training: What resumes training as it would have gone on beside the
            weights (`callbacks._training_state`: random states, data order, the
            model's structure, the job's size), or `None` (Keras's backups).
    """

    epoch: int | None
    batch: int
    digest: str
    batches_done: int = 0
    training: dict | None = dataclasses.field(default=None, compare=False)


def resolve(metadata: Any, digest: str | None) -> BackupState | str | None:
    """The state a (metadata, weights) pair of files holds.

    The metadata names the SHA-256 of the weights it goes with, and that of the
    state it replaced: the chief replaces the metadata first, then the weights,
    so a crash between the two still describes the weights on disk.

    Args:
        metadata: The parsed metadata, `None` (no file) or `CORRUPT` (unreadable).
        digest: SHA-256 of the weights file, or `None` if there is none.

    Returns:
        A `BackupState`, `None` when there is no backup, `INCOMPLETE` (a first
        backup that did not complete: no backup either), or `CORRUPT`.
    """
    if metadata is None and digest is None:
        return None
    if (digest is None and isinstance(metadata, dict) and "weights_sha256" in metadata
            and metadata.get("previous") is None):
        return INCOMPLETE  # killed during the first backup, before its weights were in place
    if metadata is CORRUPT or digest is None or not isinstance(metadata, (dict, type(None))):
        return CORRUPT
    if metadata is None:  # weights alone: Keras loads them, and keeps the epoch
        return BackupState(None, 0, digest)
    for record in (metadata, metadata.get("previous")):
        if not isinstance(record, dict):
            continue
        if record.get("weights_sha256", digest) == digest:  # no digest: written by Keras
            try:
                training = record.get("training")
                return BackupState(int(record["epoch"]), int(record.get("batch", 0)), digest,
                                   int(record.get("batches_done", 0)),
                                   training if isinstance(training, dict) else None)
            except (KeyError, TypeError, ValueError):
                return CORRUPT
    return CORRUPT


def pick(latest: BackupState | str | None, previous: BackupState | str | None,
         backup_dir: str) -> str | None:
    """Which backup to restore: `"latest"`, `"previous"` (the `.bkp` files) or `None`.

    As Keras: nothing when there is no latest backup; the previous one when
    the latest is corrupt.

    Raises:
        OSError: If the latest backup is corrupt and there is no valid previous one,
            naming its files and how to train on (`way_out`).
    """
    if latest is None or latest is INCOMPLETE or isinstance(latest, BackupState):
        return "latest" if isinstance(latest, BackupState) else None
    if isinstance(previous, BackupState):
        return "previous"
    weights = os.path.join(backup_dir, WEIGHTS_NAME)
    raise OSError(
        f"The backup in backup_dir={backup_dir!r} is corrupt: its weights file {weights} "
        f"does not match its metadata {os.path.join(backup_dir, METADATA_NAME)} (a file "
        "truncated or overwritten), or the metadata cannot be read; and there is no valid "
        f"previous backup ({weights}.bkp; double_checkpoint=True keeps one). "
        + way_out(backup_dir)
    )


def way_out(backup_dir: str) -> str:
    """What to do about a backup that cannot be restored (the end of its error)."""
    return (f"To train from scratch, delete {backup_dir} (or move it away to keep the files), "
            "or pass another backup_dir.")


def encode(*states: BackupState | str | None) -> np.ndarray:
    """Each state as `[kind, epoch, batch, digest]` int64s, for `collective.all_gather`."""
    row = []
    for s in states:
        if isinstance(s, BackupState):
            top = int(s.digest[:16], 16)
            row += [1, -1 if s.epoch is None else s.epoch, s.batch, top - (top >> 63 << 64)]
        else:
            row += [{None: 0, CORRUPT: 2, INCOMPLETE: 3}.get(s, 2), -1, 0, 0]
    return np.array(row, dtype=np.int64)


def check_shared(views: np.ndarray, backup_dir: str) -> None:
    """Raises on every worker unless each saw the chief's backup (same `encode` row).

    Raises:
        BackupNotSharedError: naming what each worker saw.
    """
    if (views == views[0]).all():
        return
    seen = "; ".join(f"worker {i}: {_describe(row)}" for i, row in enumerate(views))
    raise BackupNotSharedError(
        f"The workers see different backups in backup_dir={backup_dir!r} ({seen}). "
        "backup_dir must be on storage all workers share (a network or shared file "
        "system mounted at the same path), so that every worker restores the chief's backup."
    )


def _describe(row: np.ndarray) -> str:
    kind, epoch = int(row[0]), int(row[1])
    if kind == 0:
        return "no backup"
    if kind == 2:
        return "a corrupt backup"
    if kind == 3:
        return "an incomplete first backup"
    return f"a backup at epoch {epoch} (weights {int(row[3]) & (2**64 - 1):016x}...)"


def record(snapshot: BackupState | None) -> dict | None:
    """The metadata of a backup (Keras's `epoch` and `batch`, and kmp's fields)."""
    if snapshot is None or snapshot.epoch is None:
        return None
    fields = {"epoch": snapshot.epoch, "batch": snapshot.batch, "weights_sha256": snapshot.digest,
              "batches_done": snapshot.batches_done}
    if snapshot.training is not None:
        fields["training"] = snapshot.training
    return fields


def look(weights_path: str, metadata_path: str) -> BackupState | str | None:
    """What this worker sees of one backup (a `resolve` of its files)."""
    metadata: Any = None
    if os.path.exists(metadata_path):
        try:
            with open(metadata_path, "rb") as f:
                metadata = json.loads(f.read())
        except (OSError, ValueError):
            metadata = CORRUPT
    digest = sha256(weights_path) if os.path.exists(weights_path) else None
    return resolve(metadata, digest)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

