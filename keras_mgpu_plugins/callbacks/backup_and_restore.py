"""`BackupAndRestore`: Keras's fault-tolerance callback, safe with several workers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from typing import Any

import keras
import numpy as np

from keras_mgpu_plugins import collective, compat
from keras_mgpu_plugins.callbacks import _atomic

#: A backup whose files do not agree with each other (torn, truncated, edited).
CORRUPT = "corrupt"


class BackupNotSharedError(RuntimeError):
    """Workers see different backups: `backup_dir` is not on shared storage."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A restorable training state: a weights file and where training stood.

    Attributes:
        epoch: First epoch to run after restoring, or `None` for a weights file
            without metadata (Keras then loads the weights and keeps the epoch).
        batch: Last batch seen in that epoch when saved mid-epoch, else 0.
        digest: SHA-256 (hex) of the weights file.
    """

    epoch: int | None
    batch: int
    digest: str


def resolve(metadata: Any, digest: str | None) -> Snapshot | str | None:
    """The state a (metadata, weights) pair of files holds.

    The metadata names the SHA-256 of the weights it goes with, and that of the
    state it replaced: the chief replaces the metadata first, then the weights,
    so a crash between the two still describes the weights on disk.

    Args:
        metadata: The parsed metadata, `None` (no file) or `CORRUPT` (unreadable).
        digest: SHA-256 of the weights file, or `None` if there is none.

    Returns:
        A `Snapshot`, `None` when there is no backup, or `CORRUPT`.
    """
    if metadata is None and digest is None:
        return None
    if metadata is CORRUPT or digest is None or not isinstance(metadata, (dict, type(None))):
        return CORRUPT
    if metadata is None:  # weights alone: Keras loads them, and keeps the epoch
        return Snapshot(None, 0, digest)
    for record in (metadata, metadata.get("previous")):
        if not isinstance(record, dict):
            continue
        if record.get("weights_sha256", digest) == digest:  # no digest: written by Keras
            try:
                return Snapshot(int(record["epoch"]), int(record.get("batch", 0)), digest)
            except (KeyError, TypeError, ValueError):
                return CORRUPT
    return CORRUPT


def pick(latest: Snapshot | str | None, previous: Snapshot | str | None) -> str | None:
    """Which backup to restore: `"latest"`, `"previous"` (the `.bkp` files) or `None`.

    As Keras: nothing when there is no latest backup; the previous one when
    the latest is corrupt.

    Raises:
        OSError: If the latest backup is corrupt and there is no valid previous one.
    """
    if latest is None or isinstance(latest, Snapshot):
        return None if latest is None else "latest"
    if isinstance(previous, Snapshot):
        return "previous"
    raise OSError(
        "The backup is corrupt (its weights file does not match its metadata) and "
        "there is no valid previous backup (double_checkpoint=True keeps one)."
    )


def encode(*states: Snapshot | str | None) -> np.ndarray:
    """Each state as `[kind, epoch, batch, digest]` int64s, for `collective.all_gather`."""
    row = []
    for s in states:
        if isinstance(s, Snapshot):
            top = int(s.digest[:16], 16)
            row += [1, -1 if s.epoch is None else s.epoch, s.batch, top - (top >> 63 << 64)]
        else:
            row += [0 if s is None else 2, -1, 0, 0]
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
    return f"a backup at epoch {epoch} (weights {int(row[3]) & (2**64 - 1):016x}...)"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Backs up the training state and restores it after an interruption; worker-safe.

    A drop-in for `keras.callbacks.BackupAndRestore` (same arguments, files,
    errors and restore semantics; it is a subclass) that several workers can
    share. Keras's callback has every worker write the same files, which fails
    (h5py cannot lock `latest.weights.h5`) or tears them. Here:

    - only the chief writes `backup_dir`, atomically (a temporary file beside
      the target, fsync, `os.replace`); the metadata records the SHA-256 of its
      weights, so a torn or truncated backup is detected, never loaded.
      Other workers save to a private temporary folder that they delete, so
      every worker takes part in the same reads of distributed variables;
    - on restore, every worker reads `backup_dir` and the workers compare what
      they saw (`collective.all_gather`); if one does not see the chief's backup
      (`backup_dir` not on shared storage), all of them raise
      `BackupNotSharedError` instead of training from different states;
    - every worker then loads the same file and resumes at the same epoch.

    `backup_dir` must be a path (local, or a shared file system mounted at the
    same place on every worker), not a `gs://`-style URL.

    Args:
        backup_dir: Folder for the backup; used by this callback only.
        save_freq: `"epoch"` (back up at each epoch end), an integer (every
            that many batches), or `False` (never; Keras's preemption setting).
        double_checkpoint: Also keep the previous backup (`*.bkp`), restored
            when the latest is corrupt. Defaults to `False`.
        delete_checkpoint: Delete `backup_dir` when training completes.
            Defaults to `True`.

    Raises:
        ValueError: For an empty `backup_dir` or an invalid `save_freq` (as Keras).

    Example:
        >>> backup = kmp.callbacks.BackupAndRestore(backup_dir="/shared/run1/backup")
        >>> model.fit(x, y, epochs=20, callbacks=[backup])  # rerun the same line after a crash
    """

    def __init__(
        self,
        backup_dir: str,
        save_freq: str | int = "epoch",
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
    ) -> None:
        super().__init__(backup_dir, save_freq, double_checkpoint, delete_checkpoint)
        self.backup_dir = os.fspath(backup_dir)
        if "://" in self.backup_dir:
            raise ValueError(
                "backup_dir must be a file system path (local or a shared mount): backups "
                f"are written atomically by renaming. Received: backup_dir={backup_dir!r}"
            )
        # Our own state, under the names and values Keras's __init__ gives them; every
        # Keras hook is overridden, so no Keras code reads them and we read none of Keras's.
        self._weights_path = os.path.join(self.backup_dir, "latest.weights.h5")
        self._training_metadata_path = os.path.join(self.backup_dir, "training_metadata.json")
        self._prev_weights_path = f"{self._weights_path}.bkp"
        self._prev_training_metadata_path = f"{self._training_metadata_path}.bkp"
        self._current_epoch = self._last_batch_seen = self._batches_seen_since_last_saving = 0
        self._on_disk: Snapshot | None = None
        # Keras dispatches callbacks off the training thread only if no batch hook acts.
        compat.set_async_safe(self, save_freq == "epoch" or save_freq is False)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.model.built:
            raise ValueError(
                "To use the BackupAndRestore callback, you model must be built before "
                f"you call `fit()`. Model {self.model} is unbuilt. You can build it "
                "beforehand by calling it on a batch of data."
            )
        collective.same_settings(  # they decide when backups (collective reads) happen
            {"save_freq": self.save_freq, "double_checkpoint": bool(self.double_checkpoint),
             "delete_checkpoint": bool(self.delete_checkpoint)},
            type(self).__name__, self.model.distribute_strategy,
        )
        self._restore()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._current_epoch = epoch + 1
        self._last_batch_seen = 0
        if self.save_freq == "epoch":
            self._backup()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._batch_due(batch):
            self._backup()

    def on_train_end(self, logs: dict | None = None) -> None:
        def delete() -> None:
            if self.delete_checkpoint and collective.is_chief() and os.path.exists(self.backup_dir):
                shutil.rmtree(self.backup_dir)
                self._on_disk = None

        # also makes the next fit read what the chief left
        collective.together(delete, f"{type(self).__name__}: deleting {self.backup_dir}",
                            self.model.distribute_strategy)

    # --- restoring -------------------------------------------------------------

    def _restore(self) -> None:
        strategy = self.model.distribute_strategy
        latest, previous = collective.together(
            self._look_both, f"{type(self).__name__}: reading {self.backup_dir}", strategy
        )
        if collective.spans_workers(strategy):
            check_shared(collective.all_gather(encode(latest, previous), strategy), self.backup_dir)
        source = pick(latest, previous)
        if source == "latest" and not self._load(self._weights_path, strategy):
            if not isinstance(previous, Snapshot):
                raise OSError(f"Unable to load the backup {self._weights_path}.")
            source = "previous"
        if source == "previous":
            if not self._load(self._prev_weights_path, strategy):
                raise OSError(f"Unable to load the backup {self._prev_weights_path}.")
            collective.together(  # as Keras: the previous backup becomes the latest
                self._promote_previous, f"{type(self).__name__}: restoring {self._weights_path}",
                strategy,
            )
        snapshot = {"latest": latest, "previous": previous}.get(source or "")
        self._on_disk = snapshot if isinstance(snapshot, Snapshot) else None
        if self._on_disk is not None and self._on_disk.epoch is not None:
            compat.set_initial_epoch(self.model, self._on_disk.epoch)

    def _look_both(self) -> tuple[Snapshot | str | None, Snapshot | str | None]:
        """What this worker sees of both backups; the chief first clears stale temporaries."""
        if collective.is_chief():  # left by a writer that was killed
            _atomic.remove_stale_temps(self.backup_dir)
        return (_look(self._weights_path, self._training_metadata_path),
                _look(self._prev_weights_path, self._prev_training_metadata_path))

    def _promote_previous(self) -> None:
        if not collective.is_chief():
            return
        if os.path.exists(self._prev_training_metadata_path):
            _copy_atomic(self._prev_training_metadata_path, self._training_metadata_path)
        elif os.path.exists(self._training_metadata_path):
            os.remove(self._training_metadata_path)
        _copy_atomic(self._prev_weights_path, self._weights_path)

    def _load(self, path: str, strategy: Any) -> bool:
        """Loads `path` on every worker; `False` on all of them if one failed."""
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            with strategy.scope():
                optimizer.build(self.model.trainable_variables)
        scratch = None
        try:
            if not path.endswith(".weights.h5"):  # Keras reads weights by their suffix
                scratch = tempfile.mkdtemp(prefix="kmp-restore-")
                path = shutil.copyfile(path, os.path.join(scratch, "backup.weights.h5"))
            self.model.load_weights(path)
            failed = False
        except OSError:
            failed = True
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return not collective.agree(failed, strategy, how="any")

    # --- backing up ------------------------------------------------------------

    def _batch_due(self, batch: int) -> bool:
        if self.save_freq == "epoch" or self.save_freq is False:
            return False
        added = batch + 1 if batch <= self._last_batch_seen else batch - self._last_batch_seen
        self._batches_seen_since_last_saving += added
        self._last_batch_seen = batch
        if self._batches_seen_since_last_saving >= self.save_freq:
            self._batches_seen_since_last_saving = 0
            return True
        return False

    def _backup(self) -> None:
        collective.together(self._backup_here, f"{type(self).__name__}: writing {self._weights_path}",
                            self.model.distribute_strategy)

    def _backup_here(self) -> None:
        if not collective.is_chief():
            scratch = tempfile.mkdtemp(prefix="kmp-backup-")
            try:  # same reads of distributed variables as the chief, nothing kept
                self.model.save_weights(os.path.join(scratch, "latest.weights.h5"))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        if self.double_checkpoint and os.path.exists(self._weights_path):
            if os.path.exists(self._training_metadata_path):
                _copy_atomic(self._training_metadata_path, self._prev_training_metadata_path)
            _copy_atomic(self._weights_path, self._prev_weights_path)
        state = Snapshot(self._current_epoch, self._last_batch_seen, "")

        def write(staged: str) -> None:  # the metadata goes first: see `resolve`
            nonlocal state
            self.model.save_weights(staged, overwrite=True)
            state = dataclasses.replace(state, digest=_sha256(staged))
            record = {**_record(state), "previous": _record(self._on_disk)}
            _atomic.atomic_write(self._training_metadata_path,
                                 lambda path: _write_bytes(path, json.dumps(record).encode()))

        _atomic.atomic_write(self._weights_path, write, suffix=".weights.h5")
        self._on_disk = state


def _record(snapshot: Snapshot | None) -> dict | None:
    if snapshot is None or snapshot.epoch is None:
        return None
    return {"epoch": snapshot.epoch, "batch": snapshot.batch, "weights_sha256": snapshot.digest}


def _look(weights_path: str, metadata_path: str) -> Snapshot | str | None:
    """What this worker sees of one backup (a `resolve` of its files)."""
    metadata: Any = None
    if os.path.exists(metadata_path):
        try:
            with open(metadata_path, "rb") as f:
                metadata = json.loads(f.read())
        except (OSError, ValueError):
            metadata = CORRUPT
    digest = _sha256(weights_path) if os.path.exists(weights_path) else None
    return resolve(metadata, digest)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _copy_atomic(source: str, target: str) -> None:
    _atomic.atomic_write(target, lambda staged: shutil.copyfile(source, staged))
