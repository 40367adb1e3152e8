"""Parameter-server training on localhost: a chief, 1-2 workers and 1-2 parameter servers,
real gRPC (`kmp.launch(fn, num_workers=N, num_ps=P)`, `kmp-launch -n N --ps P`).

Each launch starts 3-5 TensorFlow processes on a 2-core machine: the tests are few, each
checks several things of one run, and the model is tiny.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.backends.tensorflow.parameter_server.steps import IN_FLIGHT_PER_WORKER

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(420)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
WANDB = importlib.util.find_spec("wandb") is not None
ROWS, BATCH, EPOCHS = 70, 16, 3  # 5 steps per epoch, the last one partial


def data(rows=ROWS):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
    return x, y


def build(steps_per_execution=1, learning_rate=0.05):
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse", metrics=["mae"],
                  steps_per_execution=steps_per_execution)
    return model


def train(strategy=None, epochs=EPOCHS, callbacks=()):
    """Trains `build()` on `data()`: one device (`strategy=None`) or in the launched cluster."""
    model = (kmp.parallelize(strategy=strategy)(build) if strategy else build)()
    x, y = data()
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                        validation_data=(x[:20], y[:20]), callbacks=list(callbacks))
    return {"weights": model.get_weights(), "history": history.history,
            "iterations": int(model.optimizer.iterations.numpy()),
            "evaluate": model.evaluate(x, y, verbose=0, return_dict=True),
            "predict": model.predict(x[:5], verbose=0),
            "test_on_batch": model.test_on_batch(x[:8], y[:8], return_dict=True),
            "placement": sorted({v.value.device for v in model.variables})}


def test_one_worker_trains_as_one_device():
    """With one worker each step sees the previous one's update: synchronous, as one device."""
    ours = kmp.launch(train, num_workers=1, num_ps=1, args=("parameter_server",),
                      timeout=400)
    assert len(ours) == 1  # fn ran on the chief only
    ours, one = ours[0], train()
    assert ours["iterations"] == one["iterations"] == EPOCHS * 5
    for a, b in zip(ours["weights"], one["weights"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for key in one["history"]:  # val_ too: evaluated on the chief, as on one device
        np.testing.assert_allclose(ours["history"][key], one["history"][key], rtol=1e-5)
    for key in ("evaluate", "test_on_batch"):
        assert ours[key] == pytest.approx(one[key], rel=1e-5)
    np.testing.assert_allclose(ours["predict"], one["predict"], atol=1e-6)
    assert ours["placement"] == ["/job:ps/replica:0/task:0/device:CPU:0"]  # every variable


class Seen:
    """Records what the chief's callbacks were given (a callback runs on the chief)."""

    @staticmethod
    def callback():
        import keras

        class Recorder(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.batches, self.epochs, self.begun = [], [], []

            def on_train_batch_begin(self, batch, logs=None):
                self.begun.append(batch)

            def on_train_batch_end(self, batch, logs=None):
                self.batches.append((batch, sorted(logs)))

            def on_epoch_end(self, epoch, logs=None):
                self.epochs.append((epoch, sorted(logs), float(logs["loss"])))

        return Recorder()


def train_with_callbacks(folder, without_atomic_updates=False):
    """Two workers, two parameter servers, kmp's callbacks and Keras's History on the chief."""
    import keras

    from keras_mgpu_plugins import compat

    model = kmp.parallelize(strategy="parameter_server")(build)(steps_per_execution=2)
    if without_atomic_updates:
        compat.remove("atomic_variable_updates")
    x, y = data(rows=160)
    recorder = Seen.callback()
    device_metrics = kmp.callbacks.DeviceMetricsLogger(csv_path=os.path.join(folder, "dm.csv"))
    callbacks = [
        recorder, device_metrics,
        kmp.callbacks.ModelCheckpoint(os.path.join(folder, "best.keras"), save_best_only=True,
                                      monitor="val_loss"),
        kmp.callbacks.EarlyStopping(monitor="val_loss", patience=50),
        kmp.callbacks.BackupAndRestore(os.path.join(folder, "backup")),
    ]
    if WANDB:
        from keras_mgpu_plugins.integrations.wandb import WandbLogger

        callbacks.append(WandbLogger(project="kmp-ps", log_checkpoints=False))
    history = model.fit(x, y, batch_size=8, epochs=4, validation_data=(x[:40], y[:40]),
                        callbacks=callbacks, verbose=0)
    best = keras.models.load_model(os.path.join(folder, "best.keras"))
    return {"iterations": int(model.optimizer.iterations.numpy()), "history": history.history,
            "batches": recorder.batches, "begun": recorder.begun, "epochs": recorder.epochs,
            "best_val_loss": float(best.evaluate(x[:40], y[:40], verbose=0)[0]),
            "shards": sorted({v.value.device for v in model.trainable_variables}),
            "backup_left": os.path.exists(os.path.join(folder, "backup")),
            "device_metrics": open(os.path.join(folder, "dm.csv")).read().splitlines()}


def test_two_workers_two_parameter_servers_callbacks_on_the_chief(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb"), "WANDB_SILENT": "true",
           "WANDB_PROJECT": None, "WANDB_RUN_GROUP": None}
    result = kmp.launch(train_with_callbacks, num_workers=2, num_ps=2, args=(str(tmp_path),),
                        env=env, timeout=400)[0]
    steps = 160 // 8  # per epoch, in closures of steps_per_execution=2
    assert result["iterations"] == 4 * steps  # every step of both workers counted
    assert result["begun"] == list(range(0, steps, 2)) * 4
    assert [b for b, _ in result["batches"]] == list(range(1, steps, 2)) * 4
    assert all(keys == ["loss", "mae"] for _, keys in result["batches"])
    assert [e for e, *_ in result["epochs"]] == [0, 1, 2, 3]
    assert result["epochs"][0][1] == ["loss", "mae", "val_loss", "val_mae"]
    losses = result["history"]["loss"]
    assert losses[-1] < losses[0] / 4  # asynchronous training converges
    assert result["best_val_loss"] == pytest.approx(min(result["history"]["val_loss"]),
                                                    rel=1e-4)
    assert not result["backup_left"]  # BackupAndRestore removes its backup after training
    assert result["shards"] == ["/job:ps/replica:0/task:0/device:CPU:0",
                                "/job:ps/replica:0/task:1/device:CPU:0"]  # round-robin
    header, *rows = result["device_metrics"]  # the chief's rows, one per epoch
    assert "epoch" in header and len(rows) == 4
    if WANDB:  # the chief's one run, with the cluster's size
        from keras_mgpu_plugins.integrations._wandb_records import find_runs, read_run

        (run,) = [read_run(path) for path in find_runs(tmp_path / "wandb")]
        assert run.finished and run.config["strategy"] == "ParameterServerStrategy"
        assert (run.config["ps_workers"], run.config["parameter_servers"]) == (2, 2)
        assert [r["loss"] for r in run.history if "epoch" in r] == result["history"]["loss"]


def test_without_atomic_updates_two_workers_lose_steps(tmp_path):
    """`kmp.compat` record atomic_variable_updates: without it, Keras's read-then-write
    assign_add lets two workers overwrite each other's count."""
    result = kmp.launch(train_with_callbacks, num_workers=2, num_ps=1,
                        args=(str(tmp_path), True), timeout=400)[0]
    assert result["iterations"] < 4 * (160 // 8)


def train_on_datasets():
    """tf.data and a dataset function as fit's x, with steps_per_execution; evaluate and
    predict on datasets."""
    import tensorflow as tf

    model = kmp.parallelize(strategy="parameter_server")(build)(steps_per_execution=3)
    x, y = data()
    finite = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)  # 5 batches
    first = model.fit(finite, epochs=2, verbose=0)
    after_finite = int(model.optimizer.iterations.numpy())

    def dataset_fn(input_context):
        rows = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(70).batch(10)
        return rows.repeat()

    second = model.fit(dataset_fn, steps_per_epoch=7, epochs=2, verbose=0,
                       validation_data=lambda: finite)
    return {"after_finite": after_finite, "iterations": int(model.optimizer.iterations.numpy()),
            "first": first.history, "second": second.history,
            "evaluate": model.evaluate(finite, verbose=0, return_dict=True),
            "predict_rows": len(model.predict(finite.map(lambda a, b: a), verbose=0))}


def test_datasets_and_steps_per_execution():
    result = kmp.launch(train_on_datasets, num_workers=2, num_ps=1, timeout=400)[0]
    assert result["after_finite"] == 2 * 5  # the dataset's cardinality is the epoch
    assert result["iterations"] == 2 * 5 + 2 * 7  # steps_per_epoch, 3 per closure, last 1
    assert set(result["second"]) == {"loss", "mae", "val_loss", "val_mae"}
    assert result["second"]["loss"][-1] < result["first"]["loss"][0]
    assert result["predict_rows"] == ROWS and result["evaluate"]["loss"] > 0


SCRIPT = """
import numpy as np
import keras
import keras_mgpu_plugins as kmp

@kmp.parallelize  # "auto": parameter servers, from the launcher's TF_CONFIG
def build():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model

model = build()
x = np.ones((32, 2), "float32")
model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=2)
print("STRATEGY", type(model.distribute_strategy).__name__, model.optimizer.iterations.numpy())
"""


def test_kmp_launch_command_runs_the_script_on_the_chief(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2",
                           "--ps", "1", "--log-dir", str(tmp_path / "logs"), str(script)],
                          capture_output=True, text=True, env=env, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[chief] STRATEGY ParameterServerStrategyV2 8" in done.stdout
    assert "[chief] Epoch 2/2" in done.stdout
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["chief.log", "ps-0.log", "worker-0.log", "worker-1.log"]
    assert "serves at" in (tmp_path / "logs" / "ps-0.log").read_text()


TABLE_ROWS, DIM = 1 << 21, 32  # a 256 MiB embedding table (float32)
TABLE_BYTES = TABLE_ROWS * DIM * 4
BUDGET = TABLE_BYTES * 3 // 4  # what each task may add to its memory: less than the table


def _peak_growth_meter():
    """Resets the peak memory (VmHWM) of this chief and its sibling tasks; returns a function
    giving each task's peak growth since, by role."""
    import json

    import psutil

    me = psutil.Process()
    tasks = {me.pid: "chief"}
    for p in me.parent().children():
        try:  # the test runner's other children may have ended (zombies): not tasks
            task = json.loads(p.environ().get("TF_CONFIG", "{}")).get("task")
        except psutil.Error:
            continue
        if p.pid != me.pid and task:
            tasks[p.pid] = f"{task['type']} {task['index']}"

    def status(pid, field):
        with open(f"/proc/{pid}/status") as f:
            line = next(x for x in f if x.startswith(field))
        return int(line.split()[1]) * 1024

    for pid in tasks:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # the peak RSS starts again from the current RSS
    base = {pid: status(pid, "VmRSS") for pid in tasks}
    return lambda: {role: status(pid, "VmHWM") - base[pid] for pid, role in tasks.items()}


def train_large_table():
    """An embedding table larger than any task's budget, split over 2 parameter servers."""
    import keras

    def factory(rows, dim, optimizer):
        model = keras.Sequential([keras.Input((4,), dtype="int32"),
                                  keras.layers.Embedding(rows, dim),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
        return model

    build = kmp.parallelize(strategy="parameter_server")(factory)  # connects to the cluster
    growth = _peak_growth_meter()
    model = build(TABLE_ROWS, DIM, keras.optimizers.SGD(0.5))
    rng = np.random.default_rng(0)
    x = rng.integers(0, TABLE_ROWS, size=(256, 4)).astype("int32")
    y = rng.normal(size=(256, 1)).astype("float32")
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    peaks = growth()
    report = kmp.placement_report(model)
    small = build(8192, 32, "adam")  # 1 MiB: split too (256 KiB shards at least)
    small.fit(x % 8192, y, batch_size=64, epochs=1, verbose=0)
    return {"peaks": peaks, "loss": history.history["loss"], "report": str(report),
            "rows": [(r.device, r.layers, r.parameter_bytes) for r in report.rows],
            "small": [(r.device, r.parameter_bytes, r.optimizer_bytes)
                      for r in kmp.placement_report(small).rows],
            "weights": [w.shape for w in model.get_weights()]}


def test_embedding_table_larger_than_a_task_trains_split_over_two_parameter_servers():
    result = kmp.launch(train_large_table, num_workers=1, num_ps=2, timeout=400)[0]
    print(result["report"], {k: f"{v / 2**20:.0f} MiB" for k, v in result["peaks"].items()})
    half = TABLE_ROWS // 2
    (ps0, vars0, bytes0), (ps1, vars1, bytes1) = result["rows"]
    assert (ps0, ps1) == ("/job:ps/replica:0/task:0/device:CPU:0",
                          "/job:ps/replica:0/task:1/device:CPU:0")
    assert f"sequential/embedding/embeddings[0:{half}]" in vars0
    assert f"sequential/embedding/embeddings[{half}:{TABLE_ROWS}]" in vars1
    assert f"rows 0:{half} on ps 0, rows {half}:{TABLE_ROWS} on ps 1" in result["report"]
    assert bytes0 >= TABLE_BYTES // 2 and bytes1 >= TABLE_BYTES // 2 - 1024
    assert result["weights"][0] == (TABLE_ROWS, DIM)  # one variable for Keras (saving, weights)
    peaks = result["peaks"]
    for role in ("ps 0", "ps 1"):  # each holds its half, not the table
        assert TABLE_BYTES * 0.4 < peaks[role] < BUDGET, (role, peaks)
    for role in ("chief", "worker 0"):  # rows looked up per shard, each shard made on its ps
        assert peaks[role] < BUDGET, (role, peaks)
    assert result["loss"][-1] < result["loss"][0]
    small_half = 8192 // 2 * 32 * 4  # 512 KiB of the small table on each parameter server
    assert all(p >= small_half for _, p, _ in result["small"])
    assert all(o >= 2 * small_half for _, _, o in result["small"])  # Adam's 2 moments, split too


def train_large_table_without(name):
    """`train_large_table` with one of kmp's records undone after the strategy applied it."""
    from keras_mgpu_plugins import compat

    kmp.parallelize(strategy="parameter_server")(lambda: None)  # connects, applies the records
    compat.remove(name)
    return train_large_table()


@pytest.mark.parametrize("record, task", [("sharded_embedding_lookup", "worker 0"),
                                          ("partitioned_initialization", "chief")])
def test_without_the_record_a_task_holds_the_whole_table(record, task):
    """Measured once: without sharded_embedding_lookup the worker peaked 1164 MiB over its
    start (the table joined at every step), without partitioned_initialization the chief
    1316 MiB (the table drawn whole, then split)."""
    peaks = kmp.launch(train_large_table_without, num_workers=1, num_ps=2, args=(record,),
                       timeout=400)[0]["peaks"]
    assert peaks[task] > TABLE_BYTES, peaks


def _task_pid(task_type, index):
    """The pid of this job's task (a sibling of the chief under the launcher), or None."""
    import json

    import psutil

    for p in psutil.Process().parent().children():
        try:
            task = json.loads(p.environ().get("TF_CONFIG", "{}")).get("task", {})
        except psutil.Error:
            continue
        if task == {"type": task_type, "index": index}:
            return p.pid
    return None


def train_through_a_lost_worker(kill_from=(1, 10), rejoined_closures=20, max_seconds=240):
    """Two workers; worker 1 is killed (SIGKILL) mid-epoch. Training goes on; the launcher
    starts it again; the chief stops once worker 1 ran `rejoined_closures` closures again.

    The kill comes at the worst moment for the chief: right after worker 1 was sent a closure
    (from batch `kill_from` on), before TensorFlow marks its result ready, which it then
    does although the result lives on the dead worker; the coordinator's thread for worker 1
    is held 2 s, so the chief reads that result before the coordinator notices the loss and
    runs the closure again.
    """
    import collections
    import signal
    import threading
    import time

    import keras
    from tensorflow.python.distribute.coordinator import cluster_coordinator, values

    done = collections.Counter()  # closures each worker finished (test instrumentation)
    lock = threading.Lock()
    process_closure = cluster_coordinator.Worker._process_closure
    execute_on = cluster_coordinator.Closure.execute_on
    set_output_of = cluster_coordinator.Closure.maybe_call_with_output_remote_value
    local = threading.local()
    copy_to_local = values.RemoteValueImpl._copy_to_local
    seen = {"chief_copies_failed": 0}

    def counting(self, closure):
        result = process_closure(self, closure)
        with lock:
            done[self.worker_index] += 1
        return result

    def killing(self, worker):
        local.worker = worker.worker_index
        execute_on(self, worker)
        if "killed_at" in seen and not seen.get("held"):
            seen["held"] = True
            time.sleep(2.0)

    def set_output(self, method):
        # Called by execute_on once the function was sent, to mark its result ready.
        if getattr(local, "worker", None) == 1 and seen.get("kill") and "killed_at" not in seen:
            seen["done_before"] = dict(done)
            os.kill(seen["pid"], signal.SIGKILL)
            seen["killed_at"] = time.monotonic()
        return set_output_of(self, method)

    def copying(self):
        try:
            return copy_to_local(self)
        except Exception:
            if threading.current_thread() is threading.main_thread():
                seen["chief_copies_failed"] += 1
            raise

    cluster_coordinator.Worker._process_closure = counting
    cluster_coordinator.Closure.execute_on = killing
    cluster_coordinator.Closure.maybe_call_with_output_remote_value = set_output
    values.RemoteValueImpl._copy_to_local = copying

    class KillWorkerOne(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if (self.epoch, batch) >= kill_from and "kill" not in seen:
                seen["pid"] = _task_pid("worker", 1)
                seen["kill"] = True

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_epoch_end(self, epoch, logs=None):
            time.sleep(0.2)  # an epoch lasts long enough for worker 1 to come back
            if "killed_at" not in seen:
                return
            if "back" not in seen and done[1] > seen["done_before"].get(1, 0):
                seen["back"] = time.monotonic() - seen["killed_at"]
                seen["back_from"] = done[1]
            back = done[1] - seen.get("back_from", done[1])
            if back >= rejoined_closures or time.monotonic() - seen["killed_at"] > max_seconds:
                self.model.stop_training = True

    model = kmp.parallelize(strategy="parameter_server")(build)()
    x, y = data(rows=320)
    history = model.fit(x, y, batch_size=16, epochs=1000, callbacks=[KillWorkerOne()],
                        verbose=0)
    ended = time.monotonic()
    return {"iterations": int(model.optimizer.iterations.numpy()),
            "epochs": len(history.history["loss"]), "loss": history.history["loss"],
            "done": dict(done), "done_before": seen["done_before"], "back": seen.get("back"),
            "continued": ended - seen["killed_at"], "new_pid": _task_pid("worker", 1),
            "old_pid": seen["pid"], "chief_copies_failed": seen["chief_copies_failed"]}


def test_a_worker_killed_mid_epoch_costs_no_step_and_rejoins(capfd):
    result = kmp.launch(train_through_a_lost_worker, num_workers=2, num_ps=1, timeout=400)[0]
    print({k: v for k, v in result.items() if k != "loss"})
    # The chief read the lost closure's result from the dead worker (before, fit then failed
    # with UnavailableError), then read it again once the closure ran on worker 0.
    assert result["chief_copies_failed"] >= 1, result
    # No step lost. The closure sent to the lost worker may have updated the variables
    # before it died, and is run again elsewhere: at most that many steps run twice.
    extra = result["iterations"] - result["epochs"] * 20
    assert 0 <= extra <= IN_FLIGHT_PER_WORKER, result["iterations"]
    assert result["new_pid"] not in (None, result["old_pid"])  # the launcher started it again
    assert result["back"] is not None  # ...and the chief sent it closures again
    assert result["done"][1] - result["done_before"].get(1, 0) >= 20
    assert result["done"][0] > result["done_before"][0]  # worker 0 went on meanwhile
    assert result["loss"][-1] < result["loss"][0]
    assert "worker 1 of the parameter-server cluster exited (signal SIGKILL" in capfd.readouterr().err


SEEDS, CONVERGENCE_EPOCHS = (0, 1, 2), 10
#: Asynchronous training's final loss may exceed one device's by this factor at most (the
#: tests' model, 10 epochs of 320 rows; measured 0.90x, 1.17x and 1.27x for seeds 0-2).
CONVERGENCE_MARGIN = 2.0


def final_losses(strategy=None):
    """The tests' model on 320 rows, per seed: the final training loss."""
    import keras

    x, y = data(rows=320)
    losses = []
    for seed in SEEDS:
        keras.utils.set_random_seed(seed)
        model = (kmp.parallelize(strategy=strategy)(build) if strategy else build)()
        keras.utils.set_random_seed(seed)  # the order of the rows
        history = model.fit(x, y, batch_size=16, epochs=CONVERGENCE_EPOCHS, verbose=0)
        losses.append(history.history["loss"][-1])
    return losses


def test_asynchronous_training_converges_as_one_device_over_three_seeds():
    ours = kmp.launch(final_losses, num_workers=2, num_ps=1, args=("parameter_server",),
                      timeout=400)[0]
    one = final_losses()
    print("final losses, parameter servers / one device:", ours, one)
    for seed, mine, reference in zip(SEEDS, ours, one, strict=True):
        assert mine <= CONVERGENCE_MARGIN * reference, (seed, mine, reference)
