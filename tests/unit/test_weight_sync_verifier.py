"""WeightSyncVerifier's decisions, with numbers (no training); the fingerprint: test_fingerprint.py."""

from __future__ import annotations

import ast
import inspect
import sys

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import _weight_sync, weight_sync_verifier
from keras_mgpu_plugins.callbacks._weight_sync import StatisticsSync, means_of_sums, save_where
from keras_mgpu_plugins.callbacks.weight_sync_verifier import (
    CheckSchedule,
    VariableMismatch,
    WeightSyncVerifier,
    classify,
    differing_copies,
)

# --- decisions ------------------------------------------------------------------------


def test_differing_copies_names_workers_and_replicas():
    fps = np.zeros((2, 2, 4), dtype=np.int64)  # workers, replicas, variables
    fps[0, 1, 1] = 7  # worker 0's second replica, variable 1
    fps[1, :, 3] = 9  # both replicas of worker 1, variable 3
    assert differing_copies(fps) == [(1, ((0, 1),)), (3, ((1, 0), (1, 1)))]
    assert differing_copies(np.ones((2, 2, 4), dtype=np.int64)) == []
    reference = np.zeros((1, 2, 1), dtype=np.int64)
    reference[0, 0, 0] = 5  # the reference itself is the odd one: the others are named
    assert differing_copies(reference) == [(0, ((0, 1),))]


def test_shards_are_compared_with_their_first_holder_only():
    absent = _weight_sync.ABSENT
    fps = np.full((2, 2, 3), absent, dtype=np.int64)  # workers, devices, pieces
    fps[:, 1, 0] = 4  # a shard on device 1 of each worker
    fps[1, 1, 0] = 5  # worker 1's copy nudged
    fps[1, :, 1] = 6  # a piece worker 0 does not hold: worker 1's device 0 is the reference
    fps[1, 1, 1] = 8
    fps[:, :, 2] = 3  # replicated: every copy equal
    assert _weight_sync.first_copy(fps[:, :, 1]) == (1, 0)
    assert differing_copies(fps) == [(0, ((1, 1),)), (1, ((1, 1),))]
    nudged = VariableMismatch("h/kernel", "model", ((1, 1),), (0.001,), shard="[:, 16:32]")
    message = _weight_sync.mismatch_message(_weight_sync.SyncReport("end of epoch 1", (nudged,), ()))
    assert message == (
        "Weights out of sync at end of epoch 1: 1 variable(s) differ from their first copy (for "
        "a shard: the first worker, then device, holding it):\n  h/kernel[:, 16:32] [model]: "
        "worker 1 device 1 (max |diff| 0.001)")


def test_classify_skips_per_replica_state_and_separates_statistics():
    stats = ("moving_mean", "moving_variance")
    assert classify("kernel", True, "auto", True, stats) == "synced"
    assert classify("kernel", False, "auto", True, stats) == "synced"  # a frozen layer's
    assert classify("moving_mean", False, "auto", True, stats) == "statistic"
    assert classify("moving_mean", True, "auto", True, stats) == "synced"
    assert classify("total", False, "on_read", True, stats) is None  # metric accumulator
    assert classify("seed_generator_state", False, "auto", True, stats) is None
    assert classify("kernel", True, "auto", False, stats) is None  # no bits to hash


def test_schedule_every_n_epochs():
    schedule = CheckSchedule(every_n_epochs=2, every_n_batches=None)
    assert [e for e in range(6) if schedule.after_epoch(e)] == [1, 3, 5]
    assert not schedule.after_batch(0)


@pytest.mark.parametrize(
    "batch_ends, expected",
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], [2, 5]),  # one step per call: steps 3 and 6
        ([1, 3, 5, 7], [1, 2]),  # steps_per_execution=2: steps 4 (crosses 3) and 6
    ],
)
def test_schedule_every_n_batches_counts_steps_across_epochs(batch_ends, expected):
    schedule = CheckSchedule(every_n_epochs=None, every_n_batches=3)
    due = []
    for _ in range(2):  # two epochs of 8 steps
        schedule.start_epoch()
        due.append([i for i, b in enumerate(batch_ends) if schedule.after_batch(b)])
    assert due[0] == expected
    assert schedule.steps == 16
    assert sum(len(d) for d in due) == 16 // 3
    assert not schedule.after_epoch(0)


def test_mismatch_record_describes_itself():
    record = VariableMismatch("dense/kernel", "model", ((0, 1), (1, 0)), (1e-3, 2.0))
    assert record.max_abs_diff == 2.0
    assert record.describe() == (
        "dense/kernel [model]: worker 0 replica 1 (max |diff| 0.001), worker 1 replica 0 (max |diff| 2)"
    )
    error = kmp.WeightsOutOfSyncError("out of sync", [record])
    assert error.mismatches == [record] and str(error) == "out of sync"


# --- arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"check_freq": 0}, "Received: check_freq=0"),
        ({"check_freq": -3}, "Received: check_freq=-3"),
        ({"check_freq": "batch"}, "check_freq must be \"epoch\" or a positive integer"),
        ({"check_freq": True}, "Received: check_freq=True"),
        ({"check_freq": 3, "every_n_batches": 3}, "pass check_freq only"),
        ({"on_mismatch": "ignore"}, "Received: on_mismatch='ignore'"),
    ],
)
def test_bad_arguments_fail_in_init(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|")):
        WeightSyncVerifier(**kwargs)


def test_defaults_and_batch_hook_only_when_asked():
    default = WeightSyncVerifier()
    assert default.schedule.every_n_epochs == 1 and default.schedule.every_n_batches is None
    assert default.on_mismatch == "raise" and not default.sync_stats
    # Keras dispatches batch hooks asynchronously only while they carry its default mark
    assert getattr(default.on_train_batch_end, "_is_default", False)
    batched = WeightSyncVerifier(check_freq=5)
    assert not getattr(batched.on_train_batch_end, "_is_default", False)
    assert batched.schedule.every_n_epochs is None and batched.schedule.every_n_batches == 5
    assert (default.check_freq, batched.check_freq) == ("epoch", 5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"every_n_batches": 0}, "Received: every_n_batches=0"),
        ({"every_n_epochs": 1.5}, "Received: every_n_epochs=1.5"),
        ({"every_n_epochs": 2, "every_n_batches": 10}, "not both. Received: every_n_epochs=2"),
    ],
)
def test_deprecated_intervals_are_still_checked(kwargs, message):
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=message):
        WeightSyncVerifier(**kwargs)


def test_deprecated_intervals_warn_and_still_work():
    with pytest.warns(DeprecationWarning, match=r"every_n_batches=...\) is deprecated.*check_freq"):
        batched = WeightSyncVerifier(every_n_batches=4)
    assert batched.schedule.every_n_batches == 4 and batched.check_freq == 4
    assert not getattr(batched.on_train_batch_end, "_is_default", False)
    with pytest.warns(DeprecationWarning, match=r"every_n_epochs=...\) is deprecated"):
        epochs = WeightSyncVerifier(every_n_epochs=3)
    assert epochs.schedule.every_n_epochs == 3 and epochs.schedule.every_n_batches is None


def test_messages_name_the_first_twenty_variables():
    records = [VariableMismatch(f"v{i}", "model", ((1, 0),), (1.0,)) for i in range(25)]
    lines = _weight_sync.lines(records).split("\n  ")
    assert len(lines) == 21 and lines[0].startswith("v0 [model]") and lines[-1] == "... and 5 more"
    assert _weight_sync.lines(records[:2]).count("\n") == 1


def test_messages_read_as_before_the_split():
    mismatch = VariableMismatch("d/kernel", "model", ((1, 0),), (0.5,))
    statistic = VariableMismatch("bn/moving_mean", "statistic", ((0, 1),), (0.25,))
    report = _weight_sync.SyncReport("end of epoch 2", (mismatch,), (statistic,))
    assert _weight_sync.mismatch_message(report) == (
        "Weights out of sync at end of epoch 2: 1 variable(s) differ from the chief's first "
        "replica (worker 0, replica 0):\n  d/kernel [model]: worker 1 replica 0 (max |diff| 0.5)")
    assert _weight_sync.mismatch_message(report, resynced=True).endswith(
        "\nResynchronised every copy from the chief's first replica.")
    later = _weight_sync.unsynced_message(report, first=False, sync_stats=True)
    assert later == ("Per-replica statistics differ at end of epoch 2:\n  "
                     "bn/moving_mean [statistic]: worker 0 replica 1 (max |diff| 0.25)")
    assert _weight_sync.unsynced_message(report, True, True).endswith("now (sync_stats=True).")
    assert _weight_sync.unsynced_message(report, True, False).endswith(
        "Pass sync_stats=True to average them at each check.")
    assert _weight_sync.one_replica_message(2).endswith("; checking across workers only.")
    assert _weight_sync.one_replica_message(1).endswith("; with one worker, nothing to compare.")
    assert _weight_sync.saved_before_message(2).startswith("A checkpoint of epoch 3 was saved before")


def test_pure_logic_imports_no_keras_and_public_names_stay_importable():
    tree = ast.parse(inspect.getsource(_weight_sync))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported == {"__future__", "dataclasses", "collections", "typing", "numpy", "keras_mgpu_plugins"}
    ours = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module and node.module.startswith("keras_mgpu_plugins")}
    assert ours == {"keras_mgpu_plugins.callbacks._freq"}  # the frequency parser: no Keras either
    freq = ast.parse(inspect.getsource(sys.modules["keras_mgpu_plugins.callbacks._freq"]))
    assert {a.name for n in ast.walk(freq) if isinstance(n, ast.Import) for a in n.names} == {"warnings"}
    for name in ("VariableMismatch", "SyncReport", "differing_copies", "classify", "CheckSchedule",
                 "DEFAULT_STATISTICS", "RNG_STATES", "ON_MISMATCH", "MAX_REPORTS", "MAX_LINES"):
        assert getattr(weight_sync_verifier, name) is getattr(_weight_sync, name), name
        assert name in weight_sync_verifier.__all__


def test_means_of_sums_over_workers_and_replicas():
    # 2 workers x 2 replicas; variables of shapes (2,) and () flattened one after another
    copies = np.array([[[1.0, 2.0, 10.0], [3.0, 4.0, 20.0]], [[5.0, 6.0, 30.0], [7.0, 8.0, 40.0]]])
    gathered = copies.sum(axis=1)  # what each worker all-gathers: its sum over its replicas
    mean, scalar = means_of_sums(gathered, replicas=2, shapes=[(2,), ()])
    np.testing.assert_array_equal(mean, [4.0, 5.0])
    assert scalar.shape == () and float(scalar) == 25.0
    (one,) = means_of_sums(np.array([[0.5, 1.5]]), replicas=1, shapes=[(1, 2)])
    np.testing.assert_array_equal(one, [[0.5, 1.5]])
    # per variable, its copies over every worker: a shard held on 1 device of each of 2 workers
    shard, whole = means_of_sums(np.array([[2.0, 6.0], [4.0, 10.0]]), replicas=[2, 4],
                                 shapes=[(), ()])
    assert (float(shard), float(whole)) == (3.0, 4.0)


def test_statistics_are_averaged_once_per_save_point():
    sync = StatisticsSync()
    assert sync.needed_before_save(0, None)
    sync.done(0, None)  # the verifier's own check at the end of epoch 1
    assert not sync.needed_before_save(0, None)  # a checkpoint listed after it
    assert sync.needed_before_save(1, None) and sync.needed_before_save(0, 3)
    sync.done(1, 3)  # before a batch-frequency save
    assert not sync.needed_before_save(1, 3) and sync.needed_before_save(1, None)
    assert sync.epoch == 0  # a batch point does not count as the epoch's end
    sync.reset()
    assert sync.needed_before_save(0, None) and sync.epoch == -1


def test_saved_before_averaging_only_at_unsynced_check_epochs():
    sync = StatisticsSync()
    assert sync.saved_before(0, None, check_due=True)  # no averaging yet at that epoch
    assert not sync.saved_before(0, None, check_due=False)  # not a check epoch: not promised
    assert not sync.saved_before(0, 5, check_due=True)  # batch saves are not promised either
    sync.done(0, None)
    assert not sync.saved_before(0, None, check_due=True)
    assert sync.saved_before(1, None, check_due=True)


def test_save_where_names_the_save_point_as_keras_counts():
    assert save_where(0, None) == "before save, end of epoch 1"
    assert save_where(2, 3) == "before save, epoch 3, batch 4"
