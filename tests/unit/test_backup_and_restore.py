"""The pure parts of `kmp.callbacks.BackupAndRestore`: which backup is whole, which
one to restore, and whether every worker sees the chief's."""

from __future__ import annotations

import numpy as np
import pytest

from keras_mgpu_plugins.callbacks.backup_and_restore import (
    CORRUPT,
    INCOMPLETE,
    BackupAndRestore,
    BackupNotSharedError,
    BackupState,
    check_shared,
    encode,
    pick,
    resolve,
)

A, B, C = "a" * 64, "b" * 64, "c" * 64


def meta(epoch, digest, previous=None, batch=0):
    return {"epoch": epoch, "batch": batch, "weights_sha256": digest, "previous": previous}


def test_no_files_no_backup():
    assert resolve(None, None) is None


def test_weights_matching_their_metadata():
    assert resolve(meta(3, A, batch=2), A) == BackupState(3, 2, A)


def test_crash_between_metadata_and_weights_restores_the_previous_state():
    # The chief replaced the metadata (epoch 4, weights B) but died before the weights.
    record = meta(4, B, previous={"epoch": 3, "batch": 0, "weights_sha256": A})
    assert resolve(record, A) == BackupState(3, 0, A)
    assert resolve(record, B) == BackupState(4, 0, B)


def test_weights_matching_neither_record_are_corrupt():
    assert resolve(meta(4, B, previous=meta(3, A)), C) is CORRUPT
    assert resolve(meta(4, B), C) is CORRUPT


def test_metadata_written_by_keras_has_no_digest_and_is_trusted():
    assert resolve({"epoch": 2, "batch": 0}, C) == BackupState(2, 0, C)


def test_weights_without_metadata_load_and_keep_the_epoch_as_keras():
    assert resolve(None, A) == BackupState(None, 0, A)


def test_killed_during_the_first_backup_is_no_backup():
    # The chief replaced the metadata of the first backup, and died before the weights.
    assert resolve(meta(1, A), None) is INCOMPLETE
    assert pick(INCOMPLETE, None, "b") is None  # start from scratch, not "corrupt"
    assert pick(INCOMPLETE, BackupState(0, 0, B), "b") is None


@pytest.mark.parametrize("metadata", [meta(2, B, previous=meta(1, A)), {"epoch": 2}, CORRUPT])
def test_metadata_without_weights_after_a_whole_backup_or_unreadable_is_corrupt(metadata):
    assert resolve(metadata, None if metadata is not CORRUPT else A) is CORRUPT


@pytest.mark.parametrize("metadata", [{"batch": 0}, {"epoch": "x"}, [1, 2]])
def test_malformed_metadata_is_corrupt(metadata):
    assert resolve(metadata, A) is CORRUPT


def test_pick_follows_keras():
    latest, previous = BackupState(3, 0, A), BackupState(2, 0, B)
    assert pick(latest, previous, "b") == "latest"
    assert pick(None, previous, "b") is None  # Keras ignores *.bkp without a latest backup
    assert pick(CORRUPT, previous, "b") == "previous"
    with pytest.raises(OSError, match="no valid previous backup"):
        pick(CORRUPT, None, "b")
    with pytest.raises(OSError):
        pick(CORRUPT, CORRUPT, "b")


def test_a_corrupt_backup_names_its_files_and_the_way_out():
    with pytest.raises(OSError) as err:
        pick(CORRUPT, None, "/runs/backup")
    assert str(err.value) == (
        "The backup in backup_dir='/runs/backup' is corrupt: its weights file "
        "/runs/backup/latest.weights.h5 does not match its metadata "
        "/runs/backup/training_metadata.json (a file truncated or overwritten), or the "
        "metadata cannot be read; and there is no valid previous backup "
        "(/runs/backup/latest.weights.h5.bkp; double_checkpoint=True keeps one). To train "
        "from scratch, delete /runs/backup (or move it away to keep the files), or pass "
        "another backup_dir.")


def test_encode_is_exact_and_distinguishes_digests():
    row = encode(BackupState(7, 3, "f" * 64), None)
    assert row.dtype == np.int64 and row.tolist()[:3] == [1, 7, 3]
    assert row[3] == -1  # 0xffff... as a signed int64
    assert row.tolist()[4:] == [0, -1, 0, 0]
    assert encode(CORRUPT, BackupState(None, 0, A)).tolist()[:5] == [2, -1, 0, 0, 1]
    assert (encode(BackupState(1, 0, A)) != encode(BackupState(1, 0, B))).any()


def test_same_view_on_every_worker_passes():
    view = encode(BackupState(3, 0, A), None)
    check_shared(np.stack([view, view]), "/shared/backup")


def test_a_worker_that_cannot_see_the_chiefs_backup_fails_with_the_remedy():
    views = np.stack([encode(BackupState(3, 0, A), None), encode(None, None)])
    with pytest.raises(BackupNotSharedError) as err:
        check_shared(views, "/local/backup")
    text = str(err.value)
    assert "backup_dir must be on storage all workers share" in text
    assert "worker 0: a backup at epoch 3 (weights aaaaaaaaaaaaaaaa...)" in text
    assert "worker 1: no backup" in text
    assert "backup_dir='/local/backup'" in text


def test_workers_seeing_different_epochs_fail():
    views = np.stack([encode(BackupState(3, 0, A), None), encode(BackupState(2, 0, B), None)])
    with pytest.raises(BackupNotSharedError, match="worker 1: a backup at epoch 2"):
        check_shared(views, "b")


# --- arguments: the same errors as Keras ----------------------------------------


@pytest.mark.parametrize("save_freq", ["batch", 0.15, None])
def test_invalid_save_freq_raises_as_keras(save_freq):
    import keras

    with pytest.raises(ValueError) as ours:
        BackupAndRestore(backup_dir="backup_dir", save_freq=save_freq)
    with pytest.raises(ValueError) as theirs:
        keras.callbacks.BackupAndRestore(backup_dir="backup_dir", save_freq=save_freq)
    assert str(ours.value) == str(theirs.value)
    assert f"Received: save_freq={save_freq}" in str(ours.value)


@pytest.mark.parametrize("backup_dir", ["", None])
def test_empty_backup_dir_raises_as_keras(backup_dir):
    with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
        BackupAndRestore(backup_dir=backup_dir)


def test_remote_url_is_refused():
    with pytest.raises(ValueError, match="Received: backup_dir='gs://bucket/backup'"):
        BackupAndRestore(backup_dir="gs://bucket/backup")


def test_keeps_keras_files_and_arguments(tmp_path):
    import keras

    ours = BackupAndRestore(str(tmp_path), save_freq=5, double_checkpoint=True)
    theirs = keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=5, double_checkpoint=True)
    assert isinstance(ours, keras.callbacks.BackupAndRestore)
    for name in ("_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path", "save_freq", "double_checkpoint",
                 "delete_checkpoint"):
        assert getattr(ours, name) == getattr(theirs, name), name


@pytest.mark.parametrize("save_freq, async_safe", [("epoch", True), (False, True), (3, False)])
def test_async_dispatch_is_kept_when_no_batch_hook_acts(save_freq, async_safe):
    assert BackupAndRestore("b", save_freq=save_freq, stop_signals=None).async_safe is async_safe
    # stop signals are checked at a batch's start, which Keras calls on the training thread
    assert BackupAndRestore("b", save_freq=save_freq).async_safe is async_safe
