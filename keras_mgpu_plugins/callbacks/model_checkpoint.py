"""`ModelCheckpoint`: Keras's checkpoint callback, atomic and chief-only.

Design: this class *subclasses* `keras.callbacks.ModelCheckpoint` so that the
argument checks, error messages, filepath formatting (`{epoch}`, `{batch}`,
`{val_loss:.2f}`...), `save_freq` counting, `mode="auto"` inference and the
best-value bookkeeping stay Keras's own code. Only Keras's private
`_save_model(epoch, batch, logs)` (the method its `on_epoch_end` and
`on_train_batch_end` call) is replaced, to change who decides, who writes and
how. It calls back into Keras's `_get_file_path` and `_should_save_model`.
These private hooks are declared in `compat.KERAS_PRIVATE_HOOKS` (private use
`"model_checkpoint_hooks"`, Keras >=3.10,<3.16): `__init__` checks them
(`compat.require`) and `tests/unit/test_compat.py` fails loudly if they
change. A proxy model handed to Keras was the alternative; it would have to
impersonate the whole `keras.Model` seen by `MonitorCallback` and by users of
`self.model`, so overriding one method is the smaller dependency.

What changes against Keras is listed in the class docstring. Saves follow
the one scheme of `io.async_writer` (every worker snapshots, the chief
writes, errors reach every worker with their cause); files are atomic
(`io.atomic`); the decision rules are `_checkpoint_rules`'.
Snapshots and their files are `io.snapshots`', which uses Keras's saving
internals through `compat`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from keras_mgpu_plugins import compat, runtime
from keras_mgpu_plugins.callbacks import events
from keras_mgpu_plugins.callbacks._checkpoint_rules import (
    agreed_logs,
    encode_monitored,
    monitored_value,
)
from keras_mgpu_plugins.io import async_writer, atomic, snapshots
from keras_mgpu_plugins.io.snapshots import check_template

_SUFFIX = {"weights": ".weights.h5", "keras": ".keras", "h5": ".h5"}


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint`, safe with several devices and workers.

    Same arguments, files, messages and errors as Keras's callback on one
    device, plus:

    - only the chief worker writes `filepath`; every worker takes the same
      decision (the chief's monitored value decides `save_best_only`);
    - a checkpoint appears at its final name complete or not at all (on a
      remote `filepath`, as far as the store allows: it is uploaded whole),
      and temporaries a killed save left are removed at the next train begin;
    - `model=template` saves a template model holding the trained weights;
    - `async_save=True` writes in a background thread;
    - each complete checkpoint is published on the trained model as the
      `"checkpoint_saved"` event of `keras_mgpu_plugins.callbacks.events`
      (on the chief only).

    Args:
        filepath: As in Keras: `.keras` or `.h5` (whole model) or `.weights.h5`
            (`save_weights_only=True`), with `{epoch}`, `{batch}` and log keys.
        monitor: As in Keras.
        verbose: As in Keras; non-chief workers print nothing.
        save_best_only: As in Keras.
        save_weights_only: As in Keras.
        mode: As in Keras.
        save_freq: As in Keras.
        initial_value_threshold: As in Keras.
        model: Optional template `keras.Model` to save instead of the model
            being trained. Its weights must match the trained model's in
            number and shapes; they receive the trained values (by value: a
            snapshot read and an `assign` of each variable) before each save,
            on every worker, on the training thread. Nothing is copied when the
            template's variables are the trained model's own.
        async_save: If `True`, the training thread only takes the snapshot
            (reads of the variables, no copy on CPU: see `io.snapshots`) and
            a background thread serialises and writes it, at most one write
            at a time (the next save waits for it). A writer error is raised
            on the training thread, on every worker at the same point, with
            its cause: at the first epoch end or save point after the write
            failed, and at the latest at the end of the epoch after the one
            that saved (a write still running then is waited for).
            `on_train_end` waits for the last write. A pending write holds one
            more copy of the variables that training updated meanwhile.

    Raises:
        ValueError: As Keras, for a bad `save_freq` or a filepath whose ending
            does not match `save_weights_only`; for a non-boolean `async_save`.
            At train begin, `kmp.collective.SettingsDifferError` (a `ValueError`)
            on every worker if `monitor`, `mode`, `save_best_only`,
            `save_weights_only`, `save_freq`, `initial_value_threshold` or
            `async_save` differ between workers.
        TypeError: If `model` is not a `keras.Model`.
        PermissionError: At train begin, on every worker, if the chief cannot
            write in the (local) folder of `filepath`.

    Example:
        >>> checkpoint = kmp.callbacks.ModelCheckpoint(
        ...     "ckpt/{epoch:02d}.keras", monitor="val_loss", save_best_only=True)
        >>> model.fit(x, y, validation_split=0.1, epochs=5, callbacks=[checkpoint])
    """

    def __init__(
        self,
        filepath: str | os.PathLike,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
        *,
        model: keras.Model | None = None,
        async_save: bool = False,
    ) -> None:
        compat.require("model_checkpoint_hooks")  # the private hooks this class relies on
        super().__init__(
            filepath,
            monitor=monitor,
            verbose=verbose,
            save_best_only=save_best_only,
            save_weights_only=save_weights_only,
            mode=mode,
            save_freq=save_freq,
            initial_value_threshold=initial_value_threshold,
        )
        if model is not None and not isinstance(model, keras.Model):
            raise TypeError(
                "model must be a keras.Model to save in place of the trained one, or "
                f"None. Received: model={model!r} of type {type(model).__name__}"
            )
        if not isinstance(async_save, bool):
            raise ValueError(
                f"async_save must be True or False. Received: async_save={async_save!r}"
            )
        snapshots.check_keras_internals()  # every save is a snapshot
        self.template = model
        self.async_save = async_save
        self._initial_value_threshold = initial_value_threshold  # `best` moves; this does not
        self._mode = mode  # Keras < 3.11 keeps no `mode`
        self._kind = snapshots.kind_of(self.filepath, save_weights_only)
        self._saves = async_writer.ChiefWrites(type(self).__name__, async_save, self._saved)
        self._writer = self._saves.writer
        self._flush = events.weak_listener(self, "_flush_now")  # finish the last write

    # --- hooks ------------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._drain(wait=True)  # a write left by an interrupted fit
        here = self._runtime()
        here.same_settings(self._collective_settings(), type(self).__name__)
        if self.template is not None and self.model.built and self.template.built:
            check_template(self.model, self.template)  # fail now, not at the first save
        directory = os.path.dirname(self.filepath.split("{", 1)[0])
        problem = atomic.prepare_folder(directory) if here.is_chief else None
        if here.agree(problem is not None, how="chief"):
            where = problem or "the chief worker cannot write there (see its error)"
            raise PermissionError(
                f"{type(self).__name__} cannot write checkpoints to the folder of "
                f"filepath: {where}. Fix its permissions or choose another filepath. "
                f"Received: filepath={self.filepath}"
            )
        if self._writer is not None:  # a consumer closing first gets our last checkpoint
            events.subscribe(self.model, "flush", self._flush)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._drain()
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._writer is not None and self._writer.has_news():
            self._drain()
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._drain()
        if self._writer is not None and self.save_freq != "epoch":  # else the save point checks
            # a write started in an earlier epoch has had an epoch: its outcome is due now
            since = self._saves.since
            self._saves.check(self._runtime(), wait=since is not None and since < epoch)
        super().on_epoch_end(epoch, logs)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._writer is not None:
            events.unsubscribe(self.model, "flush", self._flush)
            self._saves.check(self._runtime(), wait=True)

    # --- saving -----------------------------------------------------------------

    def _save_model(self, epoch: int, batch: int | None, logs: dict | None) -> None:
        """Replaces Keras's: collective decision, then an atomic chief-only write."""
        logs = logs or {}
        self._drain(wait=True)  # at most one write in flight; messages stay in order
        filepath = self._get_file_path(epoch, batch, logs)
        record = self._decide(epoch, batch, logs, filepath)  # raises a writer error everywhere
        if record is None:
            return
        # On every worker at the same point (the decision is agreed), before anything reads
        # the weights: listeners may run collectives (e.g. average per-replica statistics).
        events.publish(self.model, "before_save",
                       {"epoch": record["epoch"], "batch": record["batch"], "fit": id(self.params)})
        if record.pop("chief_path_is_dir"):
            raise OSError(
                "Please specify a non-directory filepath for ModelCheckpoint. "
                f"Filepath used is an existing directory: {filepath}"
                + ("" if self._runtime().is_chief else " (on the chief worker)")
            )
        self._saves.save(
            self._model_to_save(), self._kind,
            lambda snapshot: self._write(snapshot.write, filepath),
            record, f"saving {filepath}", self._runtime(), record["epoch"])

    def _decide(self, epoch: int, batch: int | None, logs: dict, filepath: str) -> dict | None:
        """Keras's decision on the chief's monitored value; the event record if saving."""
        here = self._runtime()
        chief = here.is_chief
        error = runtime.encode_error(self._saves.error if chief else None)
        flags = [chief and atomic.isdir(filepath)]
        local = np.concatenate([encode_monitored(logs.get(self.monitor)), flags, error])
        chief_value = here.broadcast(local)
        self._saves.raise_chief_error(chief_value[3:], here)
        with self._quiet_unless(chief):
            decided = agreed_logs(logs, self.monitor, chief_value[:2])
            if not self._should_save_model(epoch, batch, decided, filepath):
                return None
        value = monitored_value(chief_value[:2])
        return {
            "path": filepath,
            "epoch": int(epoch),
            "batch": None if batch is None else int(batch),
            "is_best": bool(self.save_best_only and value is not None),
            "monitor": self.monitor,
            "value": value,
            "chief_path_is_dir": bool(chief_value[2]),
        }

    def _collective_settings(self) -> dict[str, Any]:
        """The arguments that decide where this callback runs collectives."""
        return {
            "monitor": self.monitor, "mode": self._mode, "save_best_only": self.save_best_only,
            "save_weights_only": self.save_weights_only, "save_freq": self.save_freq,
            "initial_value_threshold": self._initial_value_threshold,
            "async_save": self.async_save,
        }

    def _runtime(self) -> runtime.Runtime:
        return runtime.of(self.model)

    def _model_to_save(self) -> keras.Model:
        """The trained model, or the template given its values (on every worker).

        Assigned here, on the training thread, not in the writer: code on this
        thread also writes the template (`multi_gpu_model`'s link, at every
        epoch end) and reads it; a writer-thread assignment could land after a
        newer one and its file mix both. Every worker's template gets the
        values, and only the chief has a writer. What stays here is one read
        and one device-side `assign` per variable (`io.snapshots.copy_weights`).
        """
        if self.template is None:
            return self.model
        snapshots.copy_weights(self.model, self.template)
        return self.template

    def _write(self, write: Any, filepath: str) -> None:
        """The chief's write (training thread, or writer thread with `async_save=True`)."""
        atomic.atomic_write(filepath, write, suffix=_SUFFIX[self._kind])

    def _saved(self, record: dict[str, Any]) -> None:
        if self.verbose > 0 and compat.checkpoint_reports_finished_saves():  # as Keras prints
            compat.keras_print_msg(
                f"\nEpoch {record['epoch'] + 1}: finished saving model to {record['path']}"
            )
        events.publish(self.model, "checkpoint_saved", dict(record))

    def _drain(self, wait: bool = False) -> None:
        """Publishes finished background writes; keeps the first writer error."""
        self._saves.drain(wait=wait)

    def _flush_now(self, payload: dict[str, Any]) -> None:
        """The `"flush"` listener: finish the last write and publish it."""
        self._drain(wait=True)

    @contextlib.contextmanager
    def _quiet_unless(self, chief: bool) -> Iterator[None]:
        verbose = self.verbose
        self.verbose = verbose if chief else 0
        try:
            yield
        finally:
            self.verbose = verbose

