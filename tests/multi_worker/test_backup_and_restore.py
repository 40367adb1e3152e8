"""`kmp.callbacks.BackupAndRestore` with 2 real workers (`kmp.launch`).

Keras's own callback fails there (both workers write `latest.weights.h5`); ours
survives a worker killed mid-training: relaunched on the same folder, the job
resumes at the interrupted epoch and ends with the weights of a run that was
never interrupted, identical on both workers. A backup only the chief can see
stops every worker with the remedy, instead of training from different states.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.launch import WorkerFailedError

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]

GLOBAL_BATCH = 16
EPOCHS = 6
KILL_EPOCH = 2  # 0-based: worker 1 dies in the third of six epochs


def make_data(n=64):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x @ rng.normal(size=(4, 1)) + 0.2).astype("float32")


def build_model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(6, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(1)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2)),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse", metrics=["mae"])
    return model


def train(callbacks, epochs=EPOCHS):
    """Builds the model under the job's strategy, fits it; returns (model, epochs run)."""
    import keras

    class EpochsRun(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(epoch)

    model = kmp.parallelize(build_model)()
    x, y = make_data()
    recorder = EpochsRun()
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[*callbacks, recorder])
    return model, recorder.epochs


def killer():
    """SIGKILLs worker 1 at the second batch of epoch KILL_EPOCH: no cleanup, no goodbye."""
    import keras

    class Kill(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if kmp.topology().worker_index == 1 and self.epoch == KILL_EPOCH and batch == 1:
                os.kill(os.getpid(), signal.SIGKILL)

    return Kill()


def run_with_backup(backup_dir, kill=False):
    from keras_mgpu_plugins.callbacks import BackupAndRestore

    callbacks = [BackupAndRestore(backup_dir)] + ([killer()] if kill else [])
    model, epochs = train(callbacks)
    return {"weights": model.get_weights(), "epochs": epochs}


def run_keras_backup(backup_dir):
    """Keras's own callback on every worker, kmp's refusal of it taken out (what Keras does)."""
    import keras

    from keras_mgpu_plugins.compat import _registry

    kmp.parallelize(build_model)()  # puts kmp's fit wrappers in force, so they can come out
    for name in ("same_calls_on_every_worker", "same_callbacks_on_every_worker"):
        _registry.remove(name)  # outermost first
    train([keras.callbacks.BackupAndRestore(backup_dir, save_freq=1)], epochs=3)


def assert_bit_identical(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        assert np.array_equal(a, b)


def test_keras_own_backup_and_restore_fails_with_two_workers(tmp_path):
    """Keeps the claim true: if Keras fixes this, this test fails and says so.

    kmp refuses Keras's callback before training on several workers
    (`tests/multi_worker/test_keras_writers.py`); this runs it without that refusal.
    """
    with pytest.raises(WorkerFailedError) as failure:
        kmp.launch(run_keras_backup, num_workers=2, args=(str(tmp_path),), timeout=200)
    text = f"{failure.value}\n{failure.value.remote_traceback}"
    assert "BlockingIOError" in text and "unable to lock file" in text, text


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    backup_dir = str(tmp_path_factory.mktemp("uninterrupted") / "backup")
    return kmp.launch(run_with_backup, num_workers=2, args=(backup_dir,), timeout=200)


def test_killed_worker_then_relaunch_resumes_and_matches_an_uninterrupted_run(
        tmp_path, uninterrupted):
    backup_dir = str(tmp_path / "backup")
    with pytest.raises(WorkerFailedError) as failure:
        kmp.launch(run_with_backup, num_workers=2, args=(backup_dir,), kwargs={"kill": True},
                   timeout=200)
    assert (failure.value.worker_index, failure.value.signal) == (1, "SIGKILL")
    # The chief's last backup: the end of the last epoch both workers completed.
    assert sorted(os.listdir(backup_dir)) == ["latest.weights.h5", "training_metadata.json"]
    with open(os.path.join(backup_dir, "training_metadata.json")) as f:
        assert json.load(f)["epoch"] == KILL_EPOCH

    resumed = kmp.launch(run_with_backup, num_workers=2, args=(backup_dir,), timeout=200)

    for worker in resumed:
        assert worker["epochs"] == list(range(KILL_EPOCH, EPOCHS))  # first epoch run: the killed one
    assert_bit_identical(resumed[0]["weights"], resumed[1]["weights"])
    assert_bit_identical(uninterrupted[0]["weights"], uninterrupted[1]["weights"])
    assert uninterrupted[0]["epochs"] == list(range(EPOCHS))
    for a, b in zip(resumed[0]["weights"], uninterrupted[0]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert not os.path.exists(backup_dir)  # deleted by the chief once training completed


def restore_from_own_folder(folders):
    """Each worker restores from its own folder (storage that is not shared)."""
    from keras_mgpu_plugins.callbacks import BackupAndRestore

    messages = []
    for pair in folders:
        try:
            train([BackupAndRestore(pair[kmp.topology().worker_index])], epochs=2)
            messages.append(None)
        except Exception as err:  # every worker must raise, at the same point
            messages.append(f"{type(err).__name__}: {err}")
    return messages


def test_backup_not_on_shared_storage_fails_fast_on_every_worker(one_job):
    _, results = one_job
    for worker, result in enumerate(results):
        messages = result["not_shared"]
        for case, message in enumerate(messages):
            assert message is not None, (worker, case)
            assert message.startswith("BackupNotSharedError"), message
            assert "backup_dir must be on storage all workers share" in message
        assert "worker 0: a backup at epoch 1" in messages[0] and "worker 1: no backup" in messages[0]
        assert "worker 0: no backup" in messages[1] and "worker 1: a backup at epoch 1" in messages[1]


def batch_backups(backup_dir):
    """Backups every 3 batches, keeping the previous one: what the chief leaves on disk,
    written synchronously, then in the background (`async_save=True`, in `backup_dir`_async)."""
    from keras_mgpu_plugins.callbacks import BackupAndRestore

    results = {}
    for folder, async_save in ((backup_dir, False), (backup_dir + "_async", True)):
        backup = BackupAndRestore(folder, save_freq=3, double_checkpoint=True,
                                  delete_checkpoint=False, async_save=async_save)
        model, _ = train([backup], epochs=2)
        results[async_save] = {"files": sorted(os.listdir(folder)), "weights": model.get_weights()}
    return results


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_batch_backups_written_by_the_chief_alone(async_save, one_job):
    folders, runs = one_job
    backup_dir = folders["batches"]
    results = [run["batches"][async_save] for run in runs]
    backup_dir += "_async" if async_save else ""
    expected = ["latest.weights.h5", "latest.weights.h5.bkp", "training_metadata.json",
                "training_metadata.json.bkp"]
    assert results[0]["files"] == results[1]["files"] == expected  # no temporary files
    with open(os.path.join(backup_dir, "training_metadata.json")) as f:
        record = json.load(f)
    assert (record["epoch"], record["batch"]) == (1, 1)  # 8 batches: saved after the 3rd, 6th
    assert record["previous"]["epoch"] == 0
    model = build_model()
    model.optimizer.build(model.trainable_variables)
    model.load_weights(os.path.join(backup_dir, "latest.weights.h5"))  # complete and loadable
    assert int(model.optimizer.iterations.numpy()) == 4 + 2  # the 6th of 8 steps
    assert_bit_identical(results[0]["weights"], results[1]["weights"])


def backup_blocked_on_the_chief(backup_dir):
    """After the first backup, a folder takes the backup's name on the chief's disk."""
    import keras

    from keras_mgpu_plugins.callbacks import BackupAndRestore

    def block(epoch, logs):
        if kmp.topology().is_chief and epoch == 0:  # listed after the backup: it exists now
            os.remove(os.path.join(backup_dir, "latest.weights.h5"))
            os.makedirs(os.path.join(backup_dir, "latest.weights.h5", "in_the_way"))

    def block_before_the_first(epoch, logs):  # the background write will fail
        if kmp.topology().is_chief and epoch == 0:
            os.makedirs(os.path.join(backup_dir + "_3", "latest.weights.h5", "in_the_way"))

    errors = []
    for callbacks in (
        [BackupAndRestore(backup_dir), keras.callbacks.LambdaCallback(on_epoch_end=block)],
        [BackupAndRestore(backup_dir + "_2", save_freq="epoch" if kmp.topology().is_chief else 2)],
        [BackupAndRestore(backup_dir + "_3", async_save=True),
         keras.callbacks.LambdaCallback(on_epoch_begin=block_before_the_first)],
    ):
        began: list[int] = []
        seen = keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda e, logs, began=began: began.append(e))
        try:
            train([*callbacks, seen])
            errors.append(None)
        except Exception as err:  # noqa: BLE001 - the test checks what each worker raised
            errors.append(f"{type(err).__name__}: {err}")
        errors.append(began)
    return errors


def test_a_backup_failing_on_the_chief_stops_every_worker_at_that_epoch(one_job):
    folders, runs = one_job
    backup_dir = folders["blocked"]
    results = [run["blocked"] for run in runs]
    (chief, _, differing_0, _, chief_async, chief_began), (other, _, differing_1, _, other_async,
                                                           other_began) = results
    for differing, here in ((differing_0, "'epoch'"), (differing_1, "2")):  # before any backup
        assert differing.startswith("SettingsDifferError: BackupAndRestore must be created with")
        assert differing.endswith(f"save_freq (here {here}; differs from the chief's on worker(s) 1).")
    assert not os.path.exists(backup_dir + "_2")
    assert chief.startswith(("IsADirectoryError", "OSError")) and "latest.weights.h5" in chief
    assert other.startswith(
        f"PeerFailedError: BackupAndRestore: writing {backup_dir}/latest.weights.h5 failed "
        f"(worker 0: {chief[:60]}")  # with the chief's own error
    # async_save=True: the first backup's background write fails on the chief; both workers
    # raise it at the next backup (the end of epoch 1), the chief its own error
    assert chief_async.startswith(("IsADirectoryError", "OSError"))
    assert other_async.startswith("PeerFailedError: BackupAndRestore(async_save=True): the "
                                  "chief's background writer failed (IsADirectoryError")
    assert chief_began == other_began == [0, 1]


def scenarios_of_one_job(folders):
    """The scenarios that end in an error every worker catches, or write only: one job."""
    return {"batches": batch_backups(folders["batches"]),
            "blocked": backup_blocked_on_the_chief(folders["blocked"]),
            "not_shared": restore_from_own_folder(folders["not_shared"])}


@pytest.fixture(scope="module")
def one_job(tmp_path_factory):
    """One launched job for three tests (each launch costs two TensorFlow start-ups)."""
    import keras

    from keras_mgpu_plugins.callbacks import BackupAndRestore

    root = tmp_path_factory.mktemp("one_job")
    seen_by_one = str(root / "backup")  # a backup at epoch 1, made by one process
    x, y = make_data()
    keras.utils.set_random_seed(0)
    build_model().fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0,
                      callbacks=[BackupAndRestore(seen_by_one, delete_checkpoint=False)])
    empty = [str(root / "empty0"), str(root / "empty1")]
    folders = {"batches": str(root / "batches" / "backup"), "blocked": str(root / "blocked"),
               "not_shared": [(seen_by_one, empty[1]),  # only the chief sees it
                              (empty[0], seen_by_one)]}  # only worker 1 sees it
    os.makedirs(root / "batches")
    return folders, kmp.launch(scenarios_of_one_job, num_workers=2, args=(folders,), timeout=200)
