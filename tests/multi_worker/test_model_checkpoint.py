"""`kmp.callbacks.ModelCheckpoint` with 2 real workers (`kmp.launch`), one shared folder.

Both workers run the same callback on the same `filepath`. Only the chief
writes (every call of the atomic writer for a path in the folder is recorded in
each process, and the folder holds each checkpoint once); the other worker reads the variables and
leaves nothing behind, neither beside the checkpoints nor in its temporary
folder. When the monitored value differs between workers (a log entry no one
reduces), both take the chief's decision. A folder the chief cannot write, or
arguments that differ between workers, stop both workers in `on_train_begin`;
there the chief also clears temporaries a killed writer left. A failed save
or background write stops both workers at the same point.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.io import atomic

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]

EPOCHS = 3
FALLING = [3.0, 2.0, 1.0]  # improves every epoch (mode "min"): saves 3 times
RISING = [10.0, 20.0, 30.0]  # improves once: saves at the first epoch only


def train(folder, filepath, chief_values, other_values, template=False, **kwargs):
    """Runs in each worker: fit with the checkpoint; reports what this process did."""
    import keras

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.callbacks import events
    from keras_mgpu_plugins.io import atomic

    index = kmp.topology().worker_index
    writes = []
    real_write = atomic.atomic_write

    def recording_write(path, write, suffix=""):
        if path.startswith(folder):  # not the launcher's StallWatchdog heartbeats
            writes.append(path)
        return real_write(path, write, suffix)

    atomic.atomic_write = recording_write
    touched = []  # every Python-level write access to the folder by this process

    def audit(event, args):
        if event == "open" and isinstance(args[0], str) and args[0].startswith(folder):
            mode, flags = args[1] or "", args[2] or 0
            if any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                touched.append(("open", args[0]))
        elif event in ("os.rename", "os.mkdir", "os.remove") and str(args[0]).startswith(folder):
            touched.append((event, str(args[-3] if event == "os.rename" else args[0])))

    import sys

    sys.addaudithook(audit)

    def layers():
        return [keras.Input((4,)), keras.layers.Dense(6, activation="relu"), keras.layers.Dense(1)]

    @kmp.parallelize
    def build():
        model = keras.Sequential(layers(), name="trained")
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        return model

    model = build()
    values = chief_values if index == 0 else other_values
    bests, weights_by_epoch, seen = [], [], []
    set_custom = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: logs.__setitem__("custom", values[epoch])
    )
    if template:
        template_model = keras.Sequential(layers(), name="template")
        checkpoint = kmp.callbacks.ParallelModelCheckpoint(
            template_model, os.path.join(folder, filepath), monitor="custom", mode="min",
            save_best_only=True, **kwargs,
        )
    else:
        checkpoint = kmp.callbacks.ModelCheckpoint(
            os.path.join(folder, filepath), monitor="custom", mode="min", save_best_only=True,
            **kwargs,
        )
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: (
            bests.append(float(checkpoint.best)), weights_by_epoch.append(model.get_weights())
        )
    )
    events.subscribe(model, "checkpoint_saved", seen.append)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    try:
        model.fit(x, y, batch_size=8, epochs=EPOCHS, shuffle=False, verbose=0,
                  callbacks=[set_custom, checkpoint, record])
    finally:
        atomic.atomic_write = real_write  # the next fit of this job records its own writes
    return {
        "index": index,
        "pid": os.getpid(),
        "writes": writes,
        "touched": touched,
        "events": seen,
        "bests": bests,
        "weights_by_epoch": weights_by_epoch,
        "template": template_model.get_weights() if template else None,
    }


def _dead_pid():
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# left by a writer of this host killed in an earlier job (its pid no longer runs)
STALE = f".c01.kmp-tmp-{atomic.host_tag()}-{_dead_pid()}-0badf00d.keras"


def train_each(jobs):
    """One launched job for several fits (each launch costs two TensorFlow start-ups)."""
    return [train(**job) for job in jobs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per run: (its folder, the job's private TMPDIR, what each worker reported)."""
    root = tmp_path_factory.mktemp("runs")
    private_tmp = root / "tmpdir"
    private_tmp.mkdir()
    setups = {
        "sync": ([STALE], dict(filepath="c{epoch:02d}.keras", chief_values=FALLING,
                               other_values=RISING)),
        "async_template": ((), dict(filepath="t{epoch:02d}.weights.h5", chief_values=RISING,
                                    other_values=FALLING, template=True, save_weights_only=True,
                                    async_save=True)),
    }
    jobs = []
    for name, (stale, kwargs) in setups.items():
        folder = root / name / "ckpt"
        folder.mkdir(parents=True)
        for stale_name in stale:
            (folder / stale_name).write_bytes(b"partial")
        jobs.append(dict(folder=str(folder), **kwargs))
    results = kmp.launch(train_each, num_workers=2, args=(jobs,), timeout=200,
                         env={"TMPDIR": str(private_tmp)})
    return {name: (root / name / "ckpt", private_tmp, [worker[i] for worker in results])
            for i, name in enumerate(setups)}


@pytest.fixture(scope="module")
def sync_run(runs):
    return runs["sync"]


@pytest.fixture(scope="module")
def async_template_run(runs):
    return runs["async_template"]


def assert_same_arrays(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)


def test_only_the_chief_writes_each_checkpoint_once(sync_run):
    folder, _, (chief, other) = sync_run
    names = ["c01.keras", "c02.keras", "c03.keras"]
    assert sorted(os.listdir(folder)) == names  # no temporary file, no copy by worker 1
    assert chief["writes"] == [str(folder / n) for n in names]
    assert other["writes"] == [] and other["events"] == []
    assert other["touched"] == []  # worker 1 opened nothing for writing, renamed nothing there
    assert ("os.remove", str(folder / STALE)) in chief["touched"]  # the chief cleared it
    assert [p for e, p in chief["touched"] if e == "os.rename"] == [str(folder / n) for n in names]
    assert [e["path"] for e in chief["events"]] == [str(folder / n) for n in names]
    assert chief["pid"] != other["pid"]


def test_decision_follows_the_chief_on_both_workers(sync_run):
    _, _, (chief, other) = sync_run
    # alone, worker 1 (RISING) would keep 10.0 as best and save once
    assert chief["bests"] == other["bests"] == FALLING
    assert [(e["epoch"], e["value"], e["is_best"]) for e in chief["events"]] == [
        (0, 3.0, True), (1, 2.0, True), (2, 1.0, True)
    ]


def test_checkpoints_hold_the_weights_both_workers_trained(sync_run):
    import keras

    folder, _, (chief, other) = sync_run
    for epoch in range(EPOCHS):
        assert_same_arrays(chief["weights_by_epoch"][epoch], other["weights_by_epoch"][epoch])
        saved = keras.saving.load_model(folder / f"c{epoch + 1:02d}.keras")
        assert_same_arrays(saved.get_weights(), chief["weights_by_epoch"][epoch])


def test_no_worker_leaves_temporary_folders(sync_run, async_template_run):
    for _, private_tmp, _ in (sync_run, async_template_run):
        assert os.listdir(private_tmp) == []


def test_async_template_saves_once_on_the_chiefs_decision(async_template_run):
    import keras

    folder, _, (chief, other) = async_template_run
    assert sorted(os.listdir(folder)) == ["t01.weights.h5"]  # RISING on the chief: epoch 1 only
    assert chief["writes"] == [str(folder / "t01.weights.h5")] and other["writes"] == []
    assert other["touched"] == [] and chief["touched"]
    assert chief["bests"] == other["bests"] == [10.0, 10.0, 10.0]
    assert [e["epoch"] for e in chief["events"]] == [0] and other["events"] == []
    template = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(6, activation="relu"), keras.layers.Dense(1)]
    )
    template.load_weights(folder / "t01.weights.h5")
    assert_same_arrays(template.get_weights(), chief["weights_by_epoch"][0])
    # every worker's template received the weights of its last save (epoch 1)
    assert_same_arrays(chief["template"], chief["weights_by_epoch"][0])
    assert_same_arrays(other["template"], chief["weights_by_epoch"][0])


def failing_saves(folder):
    """Fits whose saves fail on the chief alone; what each worker raised, and when."""
    import resource
    import signal

    import keras

    import keras_mgpu_plugins as kmp

    class Unwritable(keras.layers.Layer):  # HDF5 cannot hold an object array
        def save_own_variables(self, store):
            store["state"] = np.array([object()], dtype=object)

        def call(self, x):
            return x

    @kmp.parallelize
    def build(unwritable):
        extra = [Unwritable()] if unwritable is True else []
        width = 64 if unwritable == "big" else 2  # big: 64 KB of weights
        model = keras.Sequential([keras.Input((width,)), *extra, keras.layers.Dense(width * 4),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    chief = kmp.topology().is_chief
    # a folder at the name of the chief's second save
    os.makedirs(os.path.join(folder, "chief_path_is_dir", "dir", "2.keras"), exist_ok=True)
    cases = {
        "async_writer": (True, dict(filepath="{epoch}.weights.h5", save_weights_only=True,
                                    async_save=True)),
        "sync_writer": (True, dict(filepath="{epoch}.weights.h5", save_weights_only=True)),
        # the chief's file system refuses the write midway (RLIMIT_FSIZE: EFBIG, like ENOSPC;
        # a .keras zip: h5py's C library can crash on a failed write to an .h5 file)
        "sync_file_too_large": ("big", dict(filepath="{epoch}.keras")),
        # only the chief's filepath leads to the folder; worker 1's would save fine
        "chief_path_is_dir": (False, dict(filepath="dir/{epoch}.keras" if chief else "x/{epoch}.keras")),
        # 2 batches an epoch: saves end epochs 3 and 6; the first save fails on the chief
        "async_writer_every_3_epochs": (True, dict(filepath="{epoch}.weights.h5", save_freq=6,
                                                   save_weights_only=True, async_save=True)),
        # would not hang (save_best_only=False), but must not be run that way
        "settings_differ": (False, dict(filepath="{epoch}.keras", mode="min" if chief else "max")),
        # the chief's folder is a file (made by the test); only the chief's folder matters
        "unwritable_folder": (False, dict(filepath="a_file/ckpt.keras" if chief else "fine/ckpt.keras")),
    }
    out = {}
    for case, (unwritable, kwargs) in cases.items():
        begun = []
        marker = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs, begun=begun: begun.append(epoch))
        kwargs["filepath"] = os.path.join(folder, case, kwargs["filepath"])
        checkpoint = kmp.callbacks.ModelCheckpoint(**kwargs)
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        if case == "sync_file_too_large" and chief:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write, not a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, limit[1]))
        width = 64 if unwritable == "big" else 2
        try:
            build(unwritable).fit(np.ones((8, width)), np.ones((8, 1)), batch_size=4, epochs=6,
                                  verbose=0, callbacks=[checkpoint, marker])
            error = None
        except Exception as err:  # noqa: BLE001 - the test reports what each worker raised
            error = f"{type(err).__name__}: {err}"
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        out[case] = {"error": error, "begun": begun}
    return out


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    folder = tmp_path_factory.mktemp("failing")
    (folder / "unwritable_folder").mkdir()
    (folder / "unwritable_folder" / "a_file").write_text("not a folder")
    return folder, kmp.launch(failing_saves, num_workers=2, args=(str(folder),), timeout=200)


def test_unwritable_folder_stops_both_workers_before_training(failing):
    folder, (chief, other) = failing
    chief, other = chief["unwritable_folder"], other["unwritable_folder"]
    assert chief["error"].startswith("PermissionError")
    assert other["error"].startswith("PermissionError")
    assert "is not a folder" in chief["error"] and "a_file" in chief["error"]
    assert "the chief worker cannot write there" in other["error"]
    assert chief["begun"] == other["begun"] == []  # before training
    assert sorted(os.listdir(folder / "unwritable_folder")) == ["a_file"]


def test_async_writer_error_on_the_chief_stops_both_workers_at_the_same_epoch(failing):
    folder, (chief, other) = failing
    chief, other = chief["async_writer"], other["async_writer"]
    assert chief["error"] is not None and other["error"] is not None
    assert "the chief's background writer failed" in other["error"]
    assert "chief" not in chief["error"]  # the chief raises the writer's own error
    assert chief["begun"] == other["begun"] and len(chief["begun"]) < 6
    assert os.listdir(folder / "async_writer") == []  # no file at a final name, no temporary


def test_async_writer_error_stops_both_workers_at_an_epoch_end_before_the_next_save(failing):
    folder, (chief, other) = failing
    chief, other = chief["async_writer_every_3_epochs"], other["async_writer_every_3_epochs"]
    assert "the chief's background writer failed" in other["error"]
    assert "chief" not in chief["error"]  # the chief raises the writer's own error
    # saved at the end of epoch index 2; raised at that epoch's end or the next one, not
    # at the next save point (end of epoch index 5)
    assert chief["begun"] == other["begun"] and chief["begun"] in ([0, 1, 2], [0, 1, 2, 3])
    assert os.listdir(folder / "async_writer_every_3_epochs") == []


def test_settings_that_differ_between_workers_stop_both_before_training(failing):
    _, (chief, other) = failing
    chief, other = chief["settings_differ"], other["settings_differ"]
    assert chief["error"] == (
        "SettingsDifferError: ModelCheckpoint must be created with the same arguments on every "
        "worker: they decide where it runs collective operations, and a worker that runs fewer "
        "would leave the others waiting. Differing: mode (here 'min'; differs from the chief's "
        "on worker(s) 1)."
    )
    assert other["error"].endswith("Differing: mode (here 'max'; differs from the chief's on "
                                   "worker(s) 1).")
    assert chief["begun"] == other["begun"] == []


def test_sync_write_error_on_the_chief_stops_both_workers_at_that_save(failing):
    folder, (chief, other) = failing
    chief, other = chief["sync_writer"], other["sync_writer"]
    assert chief["error"] is not None and "worker 0" not in chief["error"]
    cause = chief["error"][:100]  # the chief's own error, carried to worker 1
    assert other["error"].startswith(
        f"PeerFailedError: ModelCheckpoint: saving {folder}/sync_writer/1.weights.h5 failed "
        f"(worker 0: {cause}")
    assert other["error"].endswith("Every worker stops here.")
    assert chief["begun"] == other["begun"] == [0]
    assert os.listdir(folder / "sync_writer") == []


def test_a_chief_whose_file_system_refuses_the_write_stops_both_with_the_cause(failing):
    folder, (chief, other) = failing
    chief, other = chief["sync_file_too_large"], other["sync_file_too_large"]
    assert chief["error"].startswith("OSError") and "File too large" in chief["error"]
    assert other["error"].startswith(
        f"PeerFailedError: ModelCheckpoint: saving {folder}/sync_file_too_large/1.keras "
        "failed (worker 0: OSError")
    assert "File too large" in other["error"]
    assert chief["begun"] == other["begun"] == [0]  # both stopped at the first save
    assert os.listdir(folder / "sync_file_too_large") == []  # the cut temporary is gone


def test_chief_filepath_that_is_a_folder_stops_both_workers_at_that_save(failing):
    folder, (chief, other) = failing
    chief, other = chief["chief_path_is_dir"], other["chief_path_is_dir"]
    assert chief["error"] == (
        "OSError: Please specify a non-directory filepath for ModelCheckpoint. Filepath used "
        f"is an existing directory: {folder}/chief_path_is_dir/dir/2.keras"
    )
    assert other["error"].startswith("OSError: Please specify a non-directory filepath")
    assert other["error"].endswith("x/2.keras (on the chief worker)")
    assert chief["begun"] == other["begun"] == [0, 1]
    assert sorted(os.listdir(folder / "chief_path_is_dir" / "dir")) == ["1.keras", "2.keras"]
    assert not os.path.exists(folder / "chief_path_is_dir" / "x")  # worker 1 wrote nothing
