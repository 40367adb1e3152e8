"""`BackupAndRestore`: Keras's fault-tolerance callback, safe with several workers.

The pure parts (which backup is whole, the write order that keeps one whole
at every crash point) are in `io.backup_state`; saves follow the one scheme of
`io.async_writer` (every worker snapshots, the chief writes).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import warnings

import keras

from keras_mgpu_plugins import compat, runtime
from keras_mgpu_plugins.io import async_writer, atomic, snapshots
from keras_mgpu_plugins.io.backup_state import (  # noqa: F401 - public names
    CORRUPT,
    INCOMPLETE,
    METADATA_NAME,
    WEIGHTS_NAME,
    BackupNotSharedError,
    BackupState,
    check_shared,
    encode,
    look,
    pick,
    record,
    resolve,
    sha256,
    way_out,
)


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Backs up the training state and restores it after an interruption; worker-safe.

    A drop-in for `keras.callbacks.BackupAndRestore` (same arguments, files,
    errors and restore semantics; it is a subclass) that several workers can
    share. Keras's callback has every worker write the same files, which fails
    (h5py cannot lock `latest.weights.h5`) or tears them. Here:

    - only the chief writes `backup_dir`, atomically (a temporary file beside
      the target, fsync, `os.replace`); the metadata records the SHA-256 of its
      weights, so a torn or truncated backup is detected, never loaded. Every
      worker takes the same snapshot of the weights in memory (the same reads
      of distributed variables), then the chief writes it;
    - a process killed at any point of a backup leaves the previous backup
      whole, or (during the very first one) no backup: the next run starts
      from scratch, with a warning;
    - on restore, every worker reads `backup_dir` and the workers compare what
      they saw (`Runtime.all_gather`); if one does not see the chief's backup
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
        async_save: If `True`, the training thread only takes the snapshot
            and a background thread writes the backup, at most one write at a
            time (the next backup waits for it). A writer error is raised on
            every worker, with its cause, at the next epoch end (or backup);
            `on_train_end` waits for the last write. Defaults to `False`.

    Raises:
        ValueError: For an empty `backup_dir` or an invalid `save_freq` (as Keras),
            or a non-boolean `async_save`.

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
        *,
        async_save: bool = False,
    ) -> None:
        super().__init__(backup_dir, save_freq, double_checkpoint, delete_checkpoint)
        if not isinstance(async_save, bool):
            raise ValueError(
                f"async_save must be True or False. Received: async_save={async_save!r}"
            )
        snapshots.check_keras_internals()  # every backup is a snapshot
        self.async_save = async_save
        self._saves = async_writer.ChiefWrites(type(self).__name__, async_save,
                                               lambda record: None)
        self.backup_dir = os.fspath(backup_dir)
        if "://" in self.backup_dir:
            raise ValueError(
                "backup_dir must be a file system path (local or a shared mount): backups "
                f"are written atomically by renaming. Received: backup_dir={backup_dir!r}"
            )
        # Our own state, under the names and values Keras's __init__ gives them; every
        # Keras hook is overridden, so no Keras code reads them and we read none of Keras's.
        self._weights_path = os.path.join(self.backup_dir, WEIGHTS_NAME)
        self._training_metadata_path = os.path.join(self.backup_dir, METADATA_NAME)
        self._prev_weights_path = f"{self._weights_path}.bkp"
        self._prev_training_metadata_path = f"{self._training_metadata_path}.bkp"
        self._current_epoch = self._last_batch_seen = self._batches_seen_since_last_saving = 0
        self._on_disk: BackupState | None = None
        # Keras dispatches callbacks off the training thread only if no batch hook acts.
        compat.set_async_safe(self, save_freq == "epoch" or save_freq is False)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.model.built:
            raise ValueError(
                "To use the BackupAndRestore callback, you model must be built before "
                f"you call `fit()`. Model {self.model} is unbuilt. You can build it "
                "beforehand by calling it on a batch of data."
            )
        runtime.of(self.model).same_settings(  # they decide when backups (collective reads) happen
            {"save_freq": self.save_freq, "double_checkpoint": bool(self.double_checkpoint),
             "delete_checkpoint": bool(self.delete_checkpoint), "async_save": self.async_save},
            type(self).__name__,
        )
        self._saves.drain(wait=True)  # a write left by an interrupted fit
        self._restore()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._current_epoch = epoch + 1
        self._last_batch_seen = 0
        if self.async_save and self.save_freq != "epoch":  # else the backup checks
            since = self._saves.since
            self._saves.check(runtime.of(self.model), wait=since is not None and since < epoch)
        if self.save_freq == "epoch":
            self._backup()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._batch_due(batch):
            self._backup()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.async_save:
            self._saves.check(runtime.of(self.model), wait=True)
        here = runtime.of(self.model)

        def delete() -> None:
            if self.delete_checkpoint and here.is_chief and os.path.exists(self.backup_dir):
                shutil.rmtree(self.backup_dir)
                self._on_disk = None

        # also makes the next fit read what the chief left
        here.together(delete, f"{type(self).__name__}: deleting {self.backup_dir}")

    # --- restoring -------------------------------------------------------------

    def _restore(self) -> None:
        here = runtime.of(self.model)
        latest, previous = here.together(
            self._look_both, f"{type(self).__name__}: reading {self.backup_dir}"
        )
        if here.spans_workers:
            check_shared(here.all_gather(encode(latest, previous)), self.backup_dir)
        source = pick(latest, previous, self.backup_dir)
        if latest is INCOMPLETE:
            warnings.warn(
                f"{type(self).__name__}: the first backup in {self.backup_dir!r} was "
                "interrupted before it completed (its metadata exists, its weights do not); "
                "there is no backup to restore, training starts from scratch.",
                UserWarning, stacklevel=2,
            )
        cause = self._load(self._weights_path, here) if source == "latest" else None
        if cause is not None:
            if not isinstance(previous, BackupState):
                raise OSError(f"Unable to load the backup {self._weights_path}: {cause}. "
                              + way_out(self.backup_dir))
            source = "previous"
        if source == "previous":
            cause = self._load(self._prev_weights_path, here)
            if cause is not None:
                raise OSError(f"Unable to load the backup {self._prev_weights_path}: "
                              f"{cause}. " + way_out(self.backup_dir))
            here.together(  # as Keras: the previous backup becomes the latest
                self._promote_previous, f"{type(self).__name__}: restoring {self._weights_path}"
            )
        snapshot = {"latest": latest, "previous": previous}.get(source or "")
        self._on_disk = snapshot if isinstance(snapshot, BackupState) else None
        if self._on_disk is not None and self._on_disk.epoch is not None:
            compat.set_initial_epoch(self.model, self._on_disk.epoch)

    def _look_both(self) -> tuple[BackupState | str | None, BackupState | str | None]:
        """What this worker sees of both backups; the chief first clears stale temporaries."""
        if runtime.of(self.model).is_chief:  # left by a writer that was killed
            atomic.remove_stale_temps(self.backup_dir)
        return (look(self._weights_path, self._training_metadata_path),
                look(self._prev_weights_path, self._prev_training_metadata_path))

    def _promote_previous(self) -> None:
        if not runtime.of(self.model).is_chief:
            return
        if os.path.exists(self._prev_training_metadata_path):
            _copy_atomic(self._prev_training_metadata_path, self._training_metadata_path)
        elif os.path.exists(self._training_metadata_path):
            os.remove(self._training_metadata_path)
        _copy_atomic(self._prev_weights_path, self._weights_path)

    def _load(self, path: str, here: runtime.Runtime) -> str | None:
        """Loads `path` on every worker; on all of them, the first failure's cause, if any."""
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            with here.scope():
                optimizer.build(self.model.trainable_variables)
        scratch = None
        try:
            if not path.endswith(".weights.h5"):  # Keras reads weights by their suffix
                scratch = tempfile.mkdtemp(prefix="kmp-restore-")
                path = shutil.copyfile(path, os.path.join(scratch, "backup.weights.h5"))
            self.model.load_weights(path)
            error = None
        except OSError as err:
            error = err
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return here.gather_errors(error)

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
        here = runtime.of(self.model)
        if self.async_save:  # at most one write in flight; its error first, everywhere
            self._saves.check(here, wait=True)
        state = BackupState(self._current_epoch, self._last_batch_seen, "")
        self._saves.save(self.model, "weights", lambda snapshot: self._write(snapshot, state),
                         {"path": self._weights_path}, f"writing {self._weights_path}",
                         here, self._current_epoch)

    def _write(self, snapshot: snapshots.Snapshot, state: BackupState) -> None:
        """The chief's backup, in the order `io.backup_state` explains (training or writer thread)."""
        if self.double_checkpoint and os.path.exists(self._weights_path):
            if os.path.exists(self._training_metadata_path):
                _copy_atomic(self._training_metadata_path, self._prev_training_metadata_path)
            _copy_atomic(self._weights_path, self._prev_weights_path)

        def write(staged: str) -> None:  # the metadata goes first
            nonlocal state
            snapshot.write(staged)
            state = dataclasses.replace(state, digest=sha256(staged))
            metadata = {**record(state), "previous": record(self._on_disk)}
            atomic.write_bytes_atomic(self._training_metadata_path, json.dumps(metadata))

        atomic.atomic_write(self._weights_path, write, suffix=".weights.h5")
        self._on_disk = state  # writes never overlap: the next one reads this


def _copy_atomic(source: str, target: str) -> None:
    atomic.atomic_write(target, lambda staged: shutil.copyfile(source, staged))
