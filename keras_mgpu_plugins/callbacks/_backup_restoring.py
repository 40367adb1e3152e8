"""How `BackupAndRestore` restores: which backup every worker loads, and where training resumes.

A mixin of `BackupAndRestore` (its attributes: `backup_dir`, the four paths, `model`,
`params`, `_on_disk`, the resume counters): the restoring half of the callback, kept
apart from the backing-up half.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Any

from keras_mgpu_plugins import compat, runtime
from keras_mgpu_plugins.callbacks import _resumed_files
from keras_mgpu_plugins.callbacks import _training_state as training
from keras_mgpu_plugins.io import atomic
from keras_mgpu_plugins.io.backup_state import (
    INCOMPLETE,
    BackupMismatchError,
    BackupState,
    check_shared,
    encode,
    look,
    pick,
    way_out,
)


class Restoring:
    """`_restore()` at train begin: the chief's backup, loaded on every worker, resumed."""

    backup_dir: str
    model: Any
    params: dict
    _on_disk: BackupState | None

    def set_model(self, model: Any) -> None:
        """Keras's `CallbackList` sets the model before any callback's `on_train_begin`: the
        log files of this `fit` wait to know where it resumes (`_resumed_files`)."""
        super().set_model(model)  # type: ignore[misc]
        self._resumed = _resumed_files.announce(model, self)
        compat.apply("csv_logger_resumes")

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
        snapshot = {"latest": latest, "previous": previous}.get(source or "")
        if isinstance(snapshot, BackupState):  # another model's backup: refused before loading
            self._build_optimizer(here)
            training.check_structure((snapshot.training or {}).get("structure"), self.model,
                                     self.backup_dir)
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
        resumed = self._on_disk is not None and self._on_disk.epoch is not None
        if resumed:
            self._resume(self._on_disk, here)
        if getattr(self, "_resumed", None) is not None:  # the log files of this fit go on
            self._resumed.known((self._on_disk.epoch, self._on_disk.batches_done)
                                if resumed else None)

    def _resume(self, state: BackupState, here: runtime.Runtime) -> None:
        """Training goes on where `state` was taken: its epoch, batch, random states, order."""
        saved = state.training or {}
        training.check_world(saved.get("world"), here.replicas_in_sync, here.num_workers,
                             self.params.get("steps"), self.backup_dir)
        training.check_data_order(saved, self.backup_dir)
        training.check_steps_per_execution(state.batches_done, self.model, self.backup_dir)
        world = saved.get("world") or {}
        self._check_split = world.get("replicas", here.replicas_in_sync) != here.replicas_in_sync
        if "seed_generators" in saved:
            training.set_seed_generators(self.model, saved["seed_generators"], self.backup_dir)
        training.set_epoch_start(saved)
        if state.batches_done:  # mid-epoch: its trained batches are drawn, seen by nothing
            self._undo_skip = self._skip(state, saved, here)
        compat.set_initial_epoch(self.model, state.epoch)
        self._current_epoch, self._resumed_at = state.epoch, state.batches_done
        self._batches_seen_since_last_saving = 0
        self._last_batch_seen = max(state.batches_done - 1, 0)  # as after that backup

    def _skip(self, state: BackupState, saved: dict, here: runtime.Runtime) -> Any:
        """Makes the resumed epoch start at the backup's batch (`compat.skip_trained_batches`);
        returns the undo.

        Raises:
            BackupMismatchError: Where this `fit` is not Keras's own, whose epoch cannot
                start mid-way.
        """
        done = state.batches_done

        def then() -> None:  # the batches are drawn: the next step is the first trained
            training.drop_fed(self.model, done)
            training.set_backend_rng_now(saved, here)

        undo = compat.skip_trained_batches(self.model, done, then)
        if undo is None:
            raise BackupMismatchError(
                f"The backup in backup_dir={self.backup_dir!r} was taken after {done} batches "
                f"of epoch {state.epoch + 1}, but this fit is not Keras's own (kmp's "
                "parameter-server fit, or a fit loop the model's class defines): its epoch "
                "cannot go on at that batch. Resume with Keras's fit, or back up with "
                "save_freq='epoch' and no stop signals. " + way_out(self.backup_dir))
        return undo

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
            copy_atomic(self._prev_training_metadata_path, self._training_metadata_path)
        elif os.path.exists(self._training_metadata_path):
            os.remove(self._training_metadata_path)
        copy_atomic(self._prev_weights_path, self._weights_path)

    def _build_optimizer(self, here: runtime.Runtime) -> None:
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            with here.scope():
                optimizer.build(self.model.trainable_variables)

    def _load(self, path: str, here: runtime.Runtime) -> str | None:
        """Loads `path` on every worker; on all of them, the first failure's cause, if any."""
        self._build_optimizer(here)
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


def copy_atomic(source: str, target: str) -> None:
    atomic.atomic_write(target, lambda staged: shutil.copyfile(source, staged))
