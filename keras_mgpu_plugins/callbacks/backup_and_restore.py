"""`BackupAndRestore`: Keras's fault-tolerance callback, safe with several workers.

The pure parts (which backup is whole, the write order that keeps one whole
at every crash point) are in `io.backup_state`; saves follow the one scheme of
`io.async_writer` (every worker snapshots, the chief writes). What a backup holds
beside the weights (random states, data order, the model's structure) is
`callbacks._training_state`; the stop at a signal is `callbacks._backup_stopping` (its
hooks) and `callbacks._stopping` (when the workers check).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import keras

from keras_mgpu_plugins import _stop_signals, compat, runtime
from keras_mgpu_plugins.callbacks import _stopping, events
from keras_mgpu_plugins.callbacks import _training_state as training
from keras_mgpu_plugins.callbacks._backup_restoring import Restoring, copy_atomic
from keras_mgpu_plugins.callbacks._backup_stopping import Stopping
from keras_mgpu_plugins.io import async_writer, atomic, snapshots
from keras_mgpu_plugins.io.backup_state import (  # noqa: F401 - public names
    CORRUPT,
    INCOMPLETE,
    METADATA_NAME,
    WEIGHTS_NAME,
    BackupMismatchError,
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


class BackupAndRestore(Restoring, Stopping, keras.callbacks.BackupAndRestore):
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
    - every worker then loads the same file and resumes where the backup was
      taken: at the epoch, and mid-epoch at the batch after the last one it
      trained (Keras restarts the epoch), with the model's random states
      (Dropout's masks) and the data order of the uninterrupted run;
    - a stop signal (`stop_signals`: SIGTERM, SIGUSR1, what schedulers send
      30-120 s before they preempt a job) is acted on at the workers' next
      check for one, within `stop_check_interval` seconds (plus the step in
      flight): every worker learns it there (one worker that got it is
      enough), the backup is written at that step, and every worker raises
      `keras_mgpu_plugins.errors.TrainingStopped` (a `SystemExit`: exit code
      75). Run the same command again to resume from that step;
    - a backup of another model or optimizer is refused (`BackupMismatchError`)
      before Keras would load part of it; a backup written by N workers (or
      devices) resumes on M with the same global batches (docs/preemption.md).

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
        stop_signals: The signals that stop training with a backup of the step
            the workers agree on: names (`"SIGTERM"`), numbers, or `None` for
            none. In one process each batch's start reads whether one came (no
            collective). Across workers they check together at the start of
            every K-th batch (and at each epoch's end, and at the end of `fit`):
            one small all-gather, with K agreed from the step and check
            times measured so that a check costs at most 0.5% of the time
            between two checks. Keras's batch hooks may still run off the
            training thread. Defaults to `("SIGTERM", "SIGUSR1")`.
        stop_check_interval: The most seconds between two such checks across
            workers (at the step time measured since the last check), hence
            the bound from a stop signal to the step the workers stop at:
            this, or one step where a step takes longer, plus the step in
            flight; the backup's write follows. `0` checks at every step (one
            collective a step). Refused above half the job's stop grace
            (`KMP_STOP_GRACE`, `kmp-launch --stop-grace`). Defaults to 2.

    Raises:
        ValueError: For an empty `backup_dir` or an invalid `save_freq` (as Keras),
            a non-boolean `async_save`, a signal that cannot be caught, or a
            `stop_check_interval` that is not seconds >= 0 or cannot honour the
            job's stop grace (the figure named).

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
        stop_signals: Any = _stop_signals.DEFAULT_SIGNALS,
        stop_check_interval: float = _stopping.DEFAULT_INTERVAL_S,
    ) -> None:
        super().__init__(backup_dir, save_freq, double_checkpoint, delete_checkpoint)
        if not isinstance(async_save, bool):
            raise ValueError(
                f"async_save must be True or False. Received: async_save={async_save!r}"
            )
        signums = _stop_signals.parse(stop_signals)
        self.stop_check_interval = _stopping.check_interval(stop_check_interval,
                                                            _stop_signals.stop_grace())
        snapshots.check_keras_internals()  # every backup is a snapshot
        self.async_save = async_save
        self.stop_signals = tuple(_stop_signals.name(n) for n in signums)
        self._signals = _stopping.Handling(signums)
        self._checks: _stopping.Checks | None = None  # this fit's, with stop signals
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
        self._batches_done = 0  # of the running epoch
        self._resumed_at = 0  # the resumed epoch's first batch (the ones before it unseen)
        self._due_at_end = False  # a periodic backup due at an epoch's last batch
        self._check_split = False  # resumed on another number of replicas: check the split
        self._epoch_start: dict = {}  # random and data-order states at the epoch's start
        self._undo_skip = lambda: None
        self._on_disk: BackupState | None = None
        self._backed_up: tuple[int, int] | None = None  # (epoch, batches) of the last backup
        # Keras dispatches batch-end hooks off the training thread only if none acts; the
        # stop checks are at a batch's start, which Keras calls on the training thread.
        compat.set_async_safe(self, save_freq == "epoch" or save_freq is False)

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        events.announce(model, "backup_dir", self.backup_dir)  # WandbLogger keeps its run id there

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.model.built:
            raise ValueError(
                "To use the BackupAndRestore callback, you model must be built before "
                f"you call `fit()`. Model {self.model} is unbuilt. You can build it "
                "beforehand by calling it on a batch of data."
            )
        runtime.of(self.model).same_settings(  # they decide when backups (collective reads) happen
            {"save_freq": self.save_freq, "double_checkpoint": bool(self.double_checkpoint),
             "delete_checkpoint": bool(self.delete_checkpoint), "async_save": self.async_save,
             "stop_signals": self.stop_signals, "stop_check_interval": self.stop_check_interval},
            type(self).__name__,
        )
        self._saves.drain(wait=True)  # a write left by an interrupted fit
        self._signals.begin(type(self).__name__)  # a signal from now on: a stop, saved
        try:
            self._restore()
        except BaseException:
            self._signals.end()  # this fit ends here
            raise
        self._begin_checks()  # a signal before the first step stops here

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._current_epoch, self._batches_done = epoch, 0
        # before the epoch's shuffle draws: what a backup within this epoch resumes with
        self._epoch_start = training.epoch_start()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._current_epoch = epoch + 1
        self._last_batch_seen = self._batches_done = self._resumed_at = 0
        self._epoch_start = training.epoch_start()  # the next epoch's start
        if self.async_save and self.save_freq != "epoch":  # else the backup checks
            since = self._saves.since
            self._saves.check(runtime.of(self.model), wait=since is not None and since < epoch)
        saved, self._due_at_end = self.save_freq == "epoch" or self._due_at_end, False
        if self._check_split:  # the epoch ended with the first step resumed on another world
            self._check_split_now()
        if saved:
            self._backup()
        self._check_at_epoch_end()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._check_split and batch > self._resumed_at:  # on the training thread
            self._check_split_now()
        super().on_train_batch_begin(batch, logs)  # the stop checks (`Stopping`)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._batches_done = batch + 1
        due = self._batch_due(batch)
        # An epoch's last batch: its backup and a stop wait for the epoch's end (validation,
        # on_epoch_end), so that a resumed fit never skips every batch of an epoch.
        if self._batches_done == self.params.get("steps"):
            self._due_at_end = due
            return
        if due:
            self._backup()

    def on_train_end(self, logs: dict | None = None) -> None:
        self._undo_skip()
        self._check_at_train_end()
        self._signals.end()
        if self.async_save:
            self._saves.check(runtime.of(self.model), wait=True)
        here = runtime.of(self.model)

        def delete() -> None:
            if self.delete_checkpoint and here.is_chief and os.path.exists(self.backup_dir):
                shutil.rmtree(self.backup_dir)
                self._on_disk = None

        # also makes the next fit read what the chief left
        here.together(delete, f"{type(self).__name__}: deleting {self.backup_dir}")

    # --- resumed on another number of replicas -------------------------------------

    def _check_split_now(self) -> None:
        """After the first step resumed on another number of replicas (on the training
        thread: it runs a collective)."""
        self._check_split = False
        training.check_split(compat.loss_tracker_rows(self.model), runtime.of(self.model),
                             (self._on_disk.training or {}).get("world", {}), self.backup_dir)

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
        extras = training.backup_extras(self.model, here, self._epoch_start,
                                        self.params.get("steps"))
        state = BackupState(self._current_epoch, max(self._batches_done - 1, 0), "",
                            self._batches_done, extras)
        self._backed_up = (self._current_epoch, self._batches_done)
        self._saves.save(self.model, "weights", lambda snapshot: self._write(snapshot, state),
                         {"path": self._weights_path}, f"writing {self._weights_path}",
                         here, self._current_epoch)

    def _write(self, snapshot: snapshots.Snapshot, state: BackupState) -> None:
        """The chief's backup, in the order `io.backup_state` explains (training or writer thread)."""
        if self.double_checkpoint and os.path.exists(self._weights_path):
            if os.path.exists(self._training_metadata_path):
                copy_atomic(self._training_metadata_path, self._prev_training_metadata_path)
            copy_atomic(self._weights_path, self._prev_weights_path)

        def write(staged: str) -> None:  # the metadata goes first
            nonlocal state
            snapshot.write(staged)
            state = dataclasses.replace(state, digest=sha256(staged))
            metadata = {**record(state), "previous": record(self._on_disk)}
            atomic.write_bytes_atomic(self._training_metadata_path, json.dumps(metadata))

        atomic.atomic_write(self._weights_path, write, suffix=".weights.h5")
        self._on_disk = state  # writes never overlap: the next one reads this
