"""The changes a `fit` resumed by `kmp.callbacks.BackupAndRestore` makes to Keras objects
(`kind="feature"`), appended to `compat._features.FEATURES`: a mid-epoch resume's trained
batches drawn before Keras's loop sees them, Keras's `CSVLogger` going on with its file."""

from __future__ import annotations

from keras_mgpu_plugins.compat._record import Patch, lazy
from keras_mgpu_plugins.compat._verify_features import _feature, _has

RESUME_FEATURES: tuple[Patch, ...] = (
    _feature(
        "resume_skips_trained_batches", "keras_mgpu_plugins.compat._trainer:skip_in_next_epoch",
        "a fit resumed mid-epoch by kmp.callbacks.BackupAndRestore trains again the batches the "
        "backup had trained; or, with them drawn and skipped in the train function, the "
        "callbacks, the progress bar, ModelCheckpoint(save_freq=N) and TensorBoard(update_freq=N) "
        "count batches nothing trained, whose logs are {} (KeyError: 'loss' in a callback's "
        "on_train_batch_end)", ("epoch iterator._enumerate_iterator",),
        "kmp.callbacks.BackupAndRestore resuming a backup taken mid-epoch (the running fit's "
        "epoch iterator, for its first epoch)",
        lazy("keras_mgpu_plugins.compat._trainer", "present"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/"
                 "epoch_iterator.py", per_instance=True),
    _feature(
        "csv_logger_resumes", "keras_mgpu_plugins.callbacks._resumed_files:wrap_csv_logger",
        "keras.callbacks.CSVLogger in a fit resumed by kmp.callbacks.BackupAndRestore "
        "overwrites its file: the epochs logged before the stop are lost (with append=True, "
        "an epoch logged after the last backup is logged twice)",
        ("keras.callbacks.CSVLogger.on_train_begin",),
        "the first kmp.callbacks.BackupAndRestore given to a fit",
        lambda: _has("keras.callbacks.CSVLogger.on_train_begin"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/callbacks/"
                 "csv_logger.py"),
)
