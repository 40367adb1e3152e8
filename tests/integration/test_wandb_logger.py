"""WandbLogger in one process (2 replicas), with the real `wandb` offline; runs read back from files."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import time

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import events
from keras_mgpu_plugins.integrations._wandb_records import find_runs, read_run
from keras_mgpu_plugins.integrations.wandb import WandbLogger

wandb = pytest.importorskip("wandb")

ROWS, BATCH, EPOCHS = 32, 8, 2
STEPS = ROWS // BATCH
SENTINEL = "kmpsentinel0123456789abcdef0123456789abcdef"  # 40 chars, like a W&B key


@pytest.fixture
def wandb_dir(tmp_path, monkeypatch):
    """A fresh W&B setup writing offline runs under tmp_path (W&B caches settings per process)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP", "WANDB_NAME", "KMP_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    wandb.teardown()
    yield tmp_path
    if wandb.run is not None:
        wandb.run.finish()
    wandb.teardown()


@kmp.parallelize(strategy="mirrored")
def build_model():
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(1))]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], "float32"))


def fit(callbacks, epochs=EPOCHS):
    model = build_model()
    x, y = data()
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model, history.history


class Publisher(keras.callbacks.Callback):
    """A sibling that writes a real checkpoint file and publishes both topics each epoch."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def on_epoch_end(self, epoch, logs=None):
        path = os.path.join(self.folder, f"ckpt-{epoch + 1}.weights.h5")
        self.model.save_weights(path)
        events.publish(self.model, "device_metrics", {
            "epoch": epoch, "batch": None, "metrics": {"device/CPU:0/memory_mb": 10.0 + epoch},
        })
        events.publish(self.model, "checkpoint_saved", {
            "path": path, "epoch": epoch, "batch": None, "is_best": epoch == 0,
            "monitor": "loss", "value": logs["loss"],
        })


def only_run(wandb_dir, timeout=60.0):
    """The one run under `wandb_dir`, read once its file holds the exit record: wandb's
    service writes the file behind the run (on a loaded machine its records were seen
    arriving after `finish` returned)."""
    runs = find_runs(wandb_dir)
    assert len(runs) == 1, runs
    deadline = time.monotonic() + timeout
    run = read_run(runs[0])
    while not run.finished and time.monotonic() < deadline:
        time.sleep(0.2)
        run = read_run(runs[0])
    return run


def b64_md5(path):
    return base64.b64encode(hashlib.md5(open(path, "rb").read()).digest()).decode()


def test_one_run_records_the_job_the_epochs_and_every_n_batches(wandb_dir):
    logger = WandbLogger(project="kmp-test", config={"lr": 0.1, "num_replicas": "mine"}, log_freq=2)
    _, history = fit([logger])
    assert wandb.run is None  # the run it started is finished
    run = only_run(wandb_dir)
    assert run.finished and run.project == "kmp-test"
    config = run.config
    assert config["strategy"] == "MirroredStrategy"
    assert (config["num_workers"], config["num_replicas"]) == (1, "mine")  # user keys win
    assert config["lr"] == 0.1
    assert (config["global_batch_size"], config["per_replica_batch_size"]) == (BATCH, BATCH // 2)
    assert [d.rsplit("/", 1)[-1] for d in config["devices"]] == ["device:CPU:0", "device:CPU:1"]
    assert config["gpu_models"] == []
    import tensorflow as tf

    assert config["keras_version"] == keras.__version__
    assert config["tensorflow_version"] == tf.__version__
    assert config["keras_mgpu_plugins_version"] == kmp.__version__
    assert config["python_version"].count(".") == 2
    epochs = [row for row in run.history if "epoch" in row]
    assert [(row["_step"], row["epoch"]) for row in epochs] == [(STEPS, 0), (2 * STEPS, 1)]
    assert [row["loss"] for row in epochs] == history["loss"]
    assert [row["mae"] for row in epochs] == history["mae"]
    batch_steps = [row["_step"] for row in run.history if "batch/loss" in row]
    assert batch_steps == [2, 4, 6, 8]
    assert [row["batch/loss"] for row in run.history if row["_step"] in (4, 8)] == history["loss"]


def test_a_one_device_model_under_the_default_strategy(wandb_dir):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[WandbLogger()])
    config = only_run(wandb_dir).config
    assert (config["strategy"], config["num_workers"], config["num_replicas"]) == ("default", 1, 1)
    assert (config["global_batch_size"], config["per_replica_batch_size"]) == (BATCH, BATCH)
    assert config["devices"] == ["/device:CPU:0"]


@pytest.mark.parametrize("logger_first", [True, False], ids=["logger-first", "logger-last"])
def test_sibling_checkpoints_and_device_metrics_whatever_the_order(wandb_dir, logger_first):
    logger, publisher = WandbLogger(project="kmp-test"), Publisher(str(wandb_dir))
    fit([logger, publisher] if logger_first else [publisher, logger])
    run = only_run(wandb_dir)
    assert [(r["_step"], r["device/CPU:0/memory_mb"]) for r in run.history] == [(4, 10), (8, 11)]
    arts = run.artifacts
    assert [(a["name"], a["type"]) for a in arts] == [(f"model-{run.id}", "model")] * EPOCHS
    assert [a["aliases"] for a in arts] == [["best", "epoch-1", "latest"], ["epoch-2", "latest"]]
    for epoch, artifact in enumerate(arts):
        path = wandb_dir / f"ckpt-{epoch + 1}.weights.h5"
        assert artifact["files"] == {path.name: b64_md5(path)}  # the complete file
        assert artifact["metadata"]["epoch"] == epoch


def test_an_active_run_is_used_and_left_open(wandb_dir):
    run = wandb.init(project="mine", config={"strategy": "my own"})
    run.log({"before": 1.0}, step=10)
    fit([WandbLogger(config={"lr": 0.1})])
    assert wandb.run is run  # neither replaced nor finished
    run.log({"after": 2.0}, step=run.step + 1)
    run.finish()
    recorded = only_run(wandb_dir)
    assert recorded.id == run.id and recorded.project == "mine"
    assert recorded.config["strategy"] == "my own"  # what the user set is kept
    assert recorded.config["num_replicas"] == 2 and recorded.config["lr"] == 0.1
    steps = [(row["_step"], sorted(set(row) & {"before", "loss", "after"})) for row in recorded.history]
    assert steps == [(10, ["before"]), (14, ["loss"]), (18, ["loss"]), (19, ["after"])]


def test_group_mode_in_one_process(wandb_dir, monkeypatch):
    fit([WandbLogger(name="exp", mode="group")], epochs=1)
    first = only_run(wandb_dir)
    assert first.name == "exp-worker0" and first.config["worker_index"] == 0
    assert first.group.startswith("kmp-") and len(first.group) == 4 + 16
    for path in find_runs(wandb_dir):
        shutil.rmtree(path)
    monkeypatch.setenv("KMP_JOB_ID", "job-42")
    fit([WandbLogger(mode="group")], epochs=1)
    second = only_run(wandb_dir)
    assert (second.name, second.group) == ("run-worker0", "job-42")


def test_disabled_mode_writes_nothing(wandb_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    wandb.teardown()
    (wandb_dir / "ckpt").mkdir()
    _, history = fit([WandbLogger(project="p"), Publisher(str(wandb_dir / "ckpt"))])
    assert len(history["loss"]) == EPOCHS
    assert [p for p in wandb_dir.rglob("*") if "ckpt" not in p.parts] == []


def test_api_key_is_never_written_or_printed(wandb_dir, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_API_KEY", SENTINEL)
    wandb.teardown()
    fit([WandbLogger(project="p", log_freq=1), Publisher(str(wandb_dir))])
    out, err = capfd.readouterr()
    files = [p for p in wandb_dir.rglob("*") if p.is_file()]
    assert len(files) > 5 and find_runs(wandb_dir)
    leaks = [str(p) for p in files if SENTINEL.encode() in p.read_bytes()]
    assert leaks == [] and SENTINEL not in out + err


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("logger_first", [True, False], ids=["logger-first", "logger-last"])
def test_kmp_model_checkpoint_files_become_artifacts(wandb_dir, logger_first, async_save,
                                                    monkeypatch):
    """Whatever the order; logger first + async relies on the 'flush' topic. The artifact
    is hashed off the training thread, from the content of the save that announced it."""
    import threading

    import wandb

    from keras_mgpu_plugins.callbacks import model_checkpoint as module
    path = wandb_dir / "best.keras"
    checkpoint = module.ModelCheckpoint(str(path), monitor="loss", save_best_only=True, async_save=async_save)
    logger = WandbLogger(project="kmp-test")
    hashed_on, saved = [], []
    real_add_file = wandb.Artifact.add_file
    monkeypatch.setattr(wandb.Artifact, "add_file", lambda self, *args, **kwargs: (
        hashed_on.append(threading.current_thread()) or real_add_file(self, *args, **kwargs)))

    class Watch(keras.callbacks.Callback):  # the file's content when its event fires
        def on_train_begin(self, logs=None):
            events.subscribe(self.model, "checkpoint_saved",
                             lambda payload: saved.append(b64_md5(payload["path"])))

    callbacks = [logger, checkpoint] if logger_first else [checkpoint, logger]
    _, history = fit([Watch(), *callbacks], epochs=3)
    assert len(hashed_on) == 3 and threading.main_thread() not in hashed_on
    assert [a["files"]["best.keras"] for a in only_run(wandb_dir).artifacts] == saved
    assert np.all(np.diff(history["loss"]) < 0)  # each epoch is the best so far: 3 saves
    run = only_run(wandb_dir)
    arts = run.artifacts
    assert [(a["name"], a["type"]) for a in arts] == [(f"model-{run.id}", "model")] * 3
    assert [a["aliases"] for a in arts] == [["best", f"epoch-{e}", "latest"] for e in (1, 2, 3)]
    assert [a["metadata"]["value"] for a in arts] == pytest.approx(history["loss"])
    assert [(a["metadata"]["epoch"], a["metadata"]["is_best"]) for a in arts] == [(0, True), (1, True), (2, True)]
    assert arts[-1]["files"] == {"best.keras": b64_md5(path)}  # the last, complete file
    assert len({a["files"]["best.keras"] for a in arts}) == 3  # 3 different files


def test_log_checkpoints_false_logs_no_artifact(wandb_dir):
    from keras_mgpu_plugins.callbacks import model_checkpoint as module
    path = wandb_dir / "best.keras"
    checkpoint = module.ModelCheckpoint(str(path), monitor="loss", save_best_only=True)
    logger = WandbLogger(project="kmp-test", log_checkpoints=False)
    fit([checkpoint, Publisher(str(wandb_dir)), logger])
    assert path.is_file() and (wandb_dir / f"ckpt-{EPOCHS}.weights.h5").is_file()  # saved, not logged
    run = only_run(wandb_dir)
    assert run.finished and run.artifacts == []
    assert [row["epoch"] for row in run.history if "epoch" in row] == list(range(EPOCHS))
    assert [row["device/CPU:0/memory_mb"] for row in run.history if "epoch" in row] == [10, 11]


@pytest.mark.parametrize("logger_first", [True, False], ids=["logger-first", "logger-last"])
def test_device_metrics_logger_records_land_at_their_steps(wandb_dir, logger_first):
    from keras_mgpu_plugins.callbacks import device_metrics_logger as module
    from keras_mgpu_plugins.samplers import ScriptedSampler

    sampler = ScriptedSampler([{"GPU:0": {"memory_mb": 100.0 * (i + 1)}} for i in range(50)])
    devices = module.DeviceMetricsLogger(log_freq=2, sampler=sampler, summary=False)
    logger = WandbLogger(project="kmp-test", log_freq=2)
    fit([logger, devices] if logger_first else [devices, logger])
    run = only_run(wandb_dir)
    key = "device/GPU:0/memory_mb"
    rows = [row for row in run.history if key in row]
    # batch records after 2 batches of each epoch, epoch records at each epoch's end
    assert [row["_step"] for row in rows] == [2, 4, 6, 8]
    assert [row["_step"] for row in rows if "epoch" in row] == [4, 8]
    assert all("batch/loss" in row for row in rows)  # merged with the batch logs of that step
    assert rows[-1]["host/memory_mb"] > 0


class LateWriter(keras.callbacks.Callback):
    """Completes its last checkpoint in on_train_end, or earlier when asked on the "flush" topic."""

    def __init__(self, folder, answers_flush):
        super().__init__()
        self.folder, self.answers_flush, self.pending = folder, answers_flush, None

    def on_train_begin(self, logs=None):
        if self.answers_flush:
            events.subscribe(self.model, "flush", lambda payload: self._complete())

    def on_epoch_end(self, epoch, logs=None):
        self.pending = epoch

    def on_train_end(self, logs=None):
        self._complete()

    def _complete(self):
        if self.pending is not None:
            path = os.path.join(self.folder, "last.weights.h5")
            self.model.save_weights(path)
            events.publish(self.model, "checkpoint_saved", {
                "path": path, "epoch": self.pending, "batch": None, "is_best": False,
                "monitor": "loss", "value": None,
            })
            self.pending = None


def test_a_checkpoint_completed_after_the_run_closed_is_reported(wandb_dir, caplog):
    fit([WandbLogger(), LateWriter(str(wandb_dir), answers_flush=False)], epochs=1)
    assert only_run(wandb_dir).artifacts == []
    assert "last.weights.h5 was completed after the W&B run was finished" in caplog.text


def test_producers_answering_flush_are_logged_before_the_run_closes(wandb_dir, caplog):
    fit([WandbLogger(), LateWriter(str(wandb_dir), answers_flush=True)], epochs=1)
    (artifact,) = only_run(wandb_dir).artifacts
    assert artifact["aliases"] == ["epoch-1", "latest"]
    assert artifact["files"] == {"last.weights.h5": b64_md5(wandb_dir / "last.weights.h5")}
    assert "after the W&B run was finished" not in caplog.text
