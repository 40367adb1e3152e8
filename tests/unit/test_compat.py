"""Every private Keras API the package relies on is declared in compat, still there, and still works.

Each `compat.PRIVATE_USES` entry is checked (names, signatures, calls) and
exercised in a real `fit` or save with the installed Keras, so a Keras upgrade
that renames or reshapes one fails here first, with the name of what changed.
The version policy (`compat.require`) is tested by pretending other versions.
The last tests scan the package: no module but those of `compat/` and
`backends/tensorflow/patches/` reaches into Keras or TensorFlow internals.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import pathlib
import re

import h5py
import keras
import numpy as np
import pytest
from packaging.version import Version

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins import compat
from keras_mgpu_plugins.callbacks import BackupAndRestore, ModelCheckpoint
from keras_mgpu_plugins.compat import _policy
from keras_mgpu_plugins.compat import _private_uses as _keras_private
from keras_mgpu_plugins.compat import _registry as _compat_patches
from tests.versions import prerelease

PACKAGE = pathlib.Path(kmp.__file__).parent
#: Where the package may touch Keras/TensorFlow internals: the registry and the patches.
COMPAT_DIRS = (PACKAGE / "compat", PACKAGE / "backends" / "tensorflow" / "patches")


def in_compat(path: pathlib.Path) -> bool:
    return any(folder in path.parents for folder in COMPAT_DIRS)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(_keras_private, "_warned", set())
    monkeypatch.setattr(_policy, "_announced", [])  # the version policy's one warning
    forget_checks(monkeypatch)


def forget_checks(monkeypatch):
    """`require` checks afresh (its cache is per Keras version; these tests change Keras)."""
    monkeypatch.setattr(_keras_private, "_checked", {})


def tiny_model(rows=10, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")], name="tiny")
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    rng = np.random.default_rng(seed)
    return model, rng.normal(size=(rows, 3)), rng.normal(size=(rows, 2))


class Recorder(keras.callbacks.Callback):
    def __init__(self, on_begin=None):
        super().__init__()
        self.on_begin, self.epochs, self.logs = on_begin, [], []

    def on_train_begin(self, logs=None):
        if self.on_begin:
            self.on_begin(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


# --- the table -------------------------------------------------------------------------


@pytest.mark.parametrize("use", compat.PRIVATE_USES, ids=lambda u: u.name)
def test_every_private_use_is_there_in_the_installed_keras(use):
    """On a release CI runs, in its checked range; on a pre-release (the canary's nightly),
    outside it by policy: still used where its check passes, with one warning."""
    if use.library in ("jax", "torch"):
        pytest.importorskip(use.library)
    assert use.check() == []
    version = _keras_private.library_version(use.library)
    if not prerelease(use.library):
        assert use.applies_to(version), (use.name, use.min_version, use.max_version)
        assert compat.require(use.name) is True
        return
    assert not use.applies_to(version)
    if use.library != "keras":
        with pytest.warns(UserWarning, match="still has it, so it is used"):
            assert compat.require(use.name) is True
        return
    assert compat.require(use.name) is True  # folded in the version policy's one warning


def test_every_private_use_has_a_behaviour_test_here():
    source = pathlib.Path(__file__).read_text()
    for use in compat.PRIVATE_USES:
        assert f"def test_use_{use.name}" in source, use.name


def test_the_table_states_its_range():
    assert _keras_private.CHECKED_BELOW == {"keras": "3.16.0", "tensorflow": "2.22.0",
                                            "jax": "0.12.0", "torch": "2.14.0"}
    for use in compat.PRIVATE_USES:
        assert use.max_version == _keras_private.CHECKED_BELOW[use.library]
        assert use.applies_to(use.min_version) and not use.applies_to(use.max_version)
    assert compat.check_private_uses() == {u.name: [] for u in compat.PRIVATE_USES}
    assert {n for n in compat.__all__ if not hasattr(compat, n)} == set()


# --- each use, in real Keras ------------------------------------------------------------


def test_use_keras_shuffle_draws():
    """kmp's draws equal Keras's own adapters' on one process, and leave the random states
    where Keras leaves them (torch's: tests/torch/test_shuffle_order.py)."""
    import random

    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    from keras_mgpu_plugins.inputs import shuffle

    assert compat.require("keras_shuffle_draws")
    for mode in (True, "batch"):
        np.random.seed(3)
        adapter = ArrayDataAdapter(np.arange(20), batch_size=8, shuffle=mode)
        rows = np.concatenate([np.asarray(b[0] if isinstance(b, tuple) else b).reshape(-1)
                               for b in adapter.get_numpy_iterator()])
        after = np.random.randint(1 << 30)
        np.random.seed(3)
        assert shuffle.numpy_order(20, 8, mode).tolist() == rows.tolist()
        assert np.random.randint(1 << 30) == after

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.full((1, 1), i, "float32")

    random.seed(4)
    order = [int(np.asarray(b).reshape(-1)[0])
             for b in PyDatasetAdapter(Batches(), shuffle=True).get_numpy_iterator()]
    random.seed(4)
    assert shuffle.batch_order(5).tolist() == order


@pytest.mark.slow  # a real fit
def test_use_model_checkpoint_hooks(tmp_path):
    base = keras.callbacks.ModelCheckpoint
    for method, params in compat.KERAS_PRIVATE_HOOKS["keras.callbacks.ModelCheckpoint"].items():
        assert tuple(inspect.signature(getattr(base, method)).parameters) == params, method

    class Calls(base):  # Keras's hooks reach an override of _save_model
        def _save_model(self, epoch, batch, logs):
            self.calls.append((epoch, batch))

    calls = Calls(str(tmp_path / "m.keras"), save_freq=2)
    calls.calls = []
    model, x, y = tiny_model(rows=8)
    model.fit(x, y, batch_size=2, epochs=1, callbacks=[calls], verbose=0)
    assert calls.calls == [(0, 1), (0, 3)]

    keras_cb = base(str(tmp_path / "m.{epoch:02d}-{loss:.2f}.keras"), monitor="loss",
                    save_best_only=True, mode="min")
    keras_cb.set_model(model)
    if hasattr(keras_cb, "_set_monitor_op"):  # Keras >= 3.11 sets it lazily, in on_epoch_end
        keras_cb._set_monitor_op()
    assert keras_cb._get_file_path(4, None, {"loss": 0.123}) == str(tmp_path / "m.05-0.12.keras")
    path = str(tmp_path / "x.keras")
    assert [keras_cb._should_save_model(e, None, {"loss": v}, path)
            for e, v in enumerate([1.0, 2.0, 0.5])] == [True, False, True]
    assert keras_cb.best == 0.5


@pytest.mark.slow  # a real fit
def test_use_saving_internals(tmp_path):
    sl = pytest.importorskip("keras.src.saving.saving_lib")
    assert list(inspect.signature(sl._save_state).parameters) == [
        "saveable", "weights_store", "assets_store", "inner_path", "visited_saveables"]
    assert compat.archive_names() == ("config.json", "metadata.json", "model.weights.h5", "assets")
    model, x, y = tiny_model()
    model.fit(x, y, epochs=1, verbose=0)
    # Keras's own walk into Keras's own store writes a file Keras loads back.
    compat.save_state_walk(model, store := compat.open_h5_store(str(tmp_path / "w.weights.h5")))
    store.close()
    other, _, _ = tiny_model(seed=1)
    other.fit(x, y, epochs=1, verbose=0)
    other.load_weights(str(tmp_path / "w.weights.h5"))
    for a, b in zip(model.get_weights() + [v.numpy() for v in model.optimizer.variables],
                    other.get_weights() + [v.numpy() for v in other.optimizer.variables], strict=True):
        np.testing.assert_array_equal(a, b)
    config, metadata = compat.serialize_model_as_json(model)
    assert json.loads(config)["config"]["name"] == "tiny"
    assert json.loads(metadata)["keras_version"] == keras.__version__
    assert issubclass(compat.h5_store_class(), type(store))
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        compat.save_model_to_hdf5(model, f)
    (tmp_path / "m.h5").write_bytes(buffer.getvalue())
    np.testing.assert_array_equal(keras.models.load_model(tmp_path / "m.h5", compile=False).predict(x, verbose=0),
                                  model.predict(x, verbose=0))


@pytest.mark.slow  # a real fit
def test_use_initial_epoch():
    model, x, y = tiny_model()
    seen = Recorder(on_begin=lambda m: compat.set_initial_epoch(m, 2))
    history = model.fit(x, y, epochs=4, callbacks=[seen], verbose=0)
    assert seen.epochs == [2, 3] and len(history.history["loss"]) == 2
    with pytest.raises(RuntimeError, match="_initial_epoch"):
        compat.set_initial_epoch(object(), 1)


def test_use_parameter_server_trainer():
    """What kmp's parameter-server loop does with Keras's trainer, checked on one device: the
    variables built in a strategy's scope from shapes alone, the strategy set aside and put
    back, the restored epoch read."""
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow.patches import ps_trainer

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    assert not model.optimizer.built
    element = (tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((None, 2), tf.float32))
    ps_trainer.build_in_scope(model, strategy, element)
    assert model.optimizer.built and model.compiled and len(model.metrics_variables) >= 4
    assert ps_trainer.strategy_of(model) is strategy
    with ps_trainer.OnTheChief(model) as held:
        assert held is strategy and ps_trainer.strategy_of(model) is None
        assert model.distribute_strategy is tf.distribute.get_strategy()
    assert ps_trainer.strategy_of(model) is strategy
    assert ps_trainer.initial_epoch(model, 3) == 3
    model._initial_epoch = 5  # as BackupAndRestore sets it at train begin
    assert ps_trainer.initial_epoch(model, 3) == 5
    assert ps_trainer.check_trainer() == []


def test_use_tf_sharded_variable():
    """A partitioned variable is a ShardedVariable whose shards hold consecutive rows."""
    import tensorflow as tf
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    from keras_mgpu_plugins.backends.tensorflow.patches import sharded

    shards = [tf.Variable(tf.ones((2, 3))), tf.Variable(tf.zeros((1, 3)))]
    table = ShardedVariable(shards)
    assert sharded.is_sharded(table) and not sharded.is_sharded(shards[0])
    assert table.variables == shards and tuple(table.shape) == (3, 3)
    assert sharded.check_sharded_variable() == []
@pytest.mark.slow  # a real fit
@pytest.mark.parametrize("per_step", [1, 2])
def test_use_fit_epoch_iterator(per_step):
    """The resumed fit's first epoch draws its first 2 batches and no hook sees them: the first
    is batch 2, with its real index and full logs; the weights are those of training on the
    rest, as Keras would (steps_per_execution=2 too)."""
    model, x, y = tiny_model(rows=16)
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"], steps_per_execution=per_step)
    seen, every, then = [], [], []

    class Hooks(keras.callbacks.Callback):
        def __init__(self, into, skip):
            super().__init__()
            self.into, self.skip = into, skip

        def on_train_begin(self, logs=None):
            if not self.skip:
                return
            assert compat.fit_epoch_iterator(self.model) is not None
            self.undo = compat.skip_trained_batches(self.model, 2, lambda: then.append(
                int(self.model.optimizer.iterations.numpy())))

        def on_train_batch_begin(self, batch, logs=None):
            self.into.append(("begin", batch))

        def on_train_batch_end(self, batch, logs=None):
            self.into.append(("end", batch, sorted(logs)))

    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[Hooks(seen, skip=True)])
    # what the installed Keras's hooks see in a whole epoch (the batch-end index of a group of
    # steps_per_execution steps is its first batch's on Keras 3.10, its last one's later)
    plain, _, _ = tiny_model(rows=16)
    plain.compile(optimizer="sgd", loss="mse", metrics=["mae"], steps_per_execution=per_step)
    plain.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[Hooks(every, skip=False)])
    assert len(every) == 2 * (4 // per_step) and every[0] == ("begin", 0)
    assert seen == every[2 // per_step * 2:] + every  # epoch 1 from batch 2, epoch 2 whole
    assert then == [0]  # once, before the first trained step
    reference, _, _ = tiny_model(rows=16)
    reference.fit(x[8:], y[8:], batch_size=4, epochs=1, shuffle=False, verbose=0)
    reference.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    assert compat.fit_epoch_iterator(model) is None  # outside fit


def test_use_fit_epoch_iterator_refuses_a_fit_it_does_not_know(monkeypatch):
    from keras_mgpu_plugins.compat import _trainer

    model, x, y = tiny_model()
    monkeypatch.setattr(_trainer, "_trainer_fit", lambda backend: None)
    forget_checks(monkeypatch)
    found = []

    class Resume(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            with pytest.raises(compat.UncheckedVersionError) as refused:
                compat.skip_trained_batches(self.model, 1)
            found.append(str(refused.value))

    model.fit(x, y, batch_size=5, epochs=1, verbose=0, callbacks=[Resume()])
    assert "the tensorflow backend's trainer fit is not known" in found[0]
    assert "save_freq='epoch'" in found[0]


def test_use_train_function_watched():
    """Every step is timed, the first counted once, the weights are Keras's own, and the
    train function is Keras's again after the fit."""
    from keras_mgpu_plugins import _step_phases

    model, x, y = tiny_model(rows=12)
    watches, steps = [], []

    class Watching(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            watches.append(compat.watch_steps(self.model))

        def on_train_batch_end(self, batch, logs=None):
            steps.append(float(_step_phases.CLOCK.totals[_step_phases.STEP]))

        def on_train_end(self, logs=None):
            watches[-1].undo()

    kept = model.train_function
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[Watching()])
    assert len(steps) == 6 and all(b > a for a, b in zip(steps, steps[1:], strict=False))
    count = watches[0].count
    assert count.reason is None and count.flops_per_sample > 0 and count.rows == 4
    assert vars(model).get("train_function") is not watches[0].watched
    assert kept is None or model.train_function is kept
    reference, _, _ = tiny_model(rows=12)
    reference.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_use_print_msg(capsys, monkeypatch):
    compat.keras_print_msg("saved it")
    assert capsys.readouterr().out == "saved it\n"
    keras.config.disable_interactive_logging()
    try:
        compat.keras_print_msg("to the log")
    finally:
        keras.config.enable_interactive_logging()
    assert capsys.readouterr().out == ""
    # the documented fallback where Keras's print_msg is gone
    monkeypatch.delattr("keras.src.utils.io_utils.print_msg")
    forget_checks(monkeypatch)  # the same Keras version, changed under the cache
    with pytest.warns(UserWarning, match="print_msg is missing"):
        compat.keras_print_msg("still printed")
    assert capsys.readouterr().out == "still printed\n"


def test_use_async_safe(monkeypatch):
    # Keras dispatches asynchronously only on backends it deems thread-safe (not TF, 3.15)
    monkeypatch.setattr("keras.src.backend.IS_THREAD_SAFE", True)

    class BatchHook(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    hook = BatchHook()
    assert keras.callbacks.CallbackList([hook])._async_train is False
    compat.set_async_safe(hook, True)
    assert keras.callbacks.CallbackList([hook])._async_train is True
    assert BackupAndRestore("b", stop_signals=None).async_safe is True
    assert BackupAndRestore("b", 3, stop_signals=None).async_safe is False
    assert BackupAndRestore("b").async_safe is True  # stop signals: checked at a batch's start


@pytest.mark.slow  # a real fit
def test_use_progbar_after_history(capsys):
    model, x, y = tiny_model()

    class AddKeys(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs.update({"hidden_key": 7.0, "shown_key": 8.0})

    undo = []
    adder = AddKeys()
    after = Recorder(on_begin=lambda m: undo.append(compat.hide_from_progbar(m, lambda: ["hidden_key"])))
    history = model.fit(x, y, epochs=1, callbacks=[adder, after], verbose=2)
    out = capsys.readouterr().out
    assert "shown_key: 8" in out and "hidden_key" not in out  # the progress bar ran last
    assert after.logs[0]["hidden_key"] == 7.0 and history.history["hidden_key"] == [7.0]
    undo[0]()
    assert "on_epoch_end" not in vars(model.history)
    assert compat.hide_from_progbar(object(), lambda: []) is None  # no History: nothing wrapped


@pytest.mark.slow  # a real fit
def test_use_loss_tracker_rows(monkeypatch):
    model, x, y = tiny_model(rows=10)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # batches of 4, 4, 2
    assert compat.loss_tracker_rows(model) == [10.0]

    @kmp.parallelize(strategy="mirrored")
    def build():
        return tiny_model(rows=10)[0]

    mirrored = build()
    # evaluate counts as train_step does and runs no gradient collective, which another
    # MirroredStrategy of this process (multi_gpu_model tests) could collide with
    mirrored.evaluate(x, y, batch_size=4, verbose=0)
    rows = compat.loss_tracker_rows(mirrored)
    assert len(rows) == 2 and sum(rows) == 10.0
    uncompiled = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert compat.loss_tracker_rows(uncompiled) is None
    monkeypatch.setattr(keras, "__version__", "3.1.0")  # counted batches, not rows
    with pytest.warns(UserWarning, match="batch_size="):
        assert compat.loss_tracker_rows(model) is None


def test_use_jax_initialize_rng():
    """On JAX, kmp runs Keras's own seed agreement (tests/jax/ run it across 2 processes)."""
    pytest.importorskip("jax")
    from keras_mgpu_plugins.compat import _private, _private_uses

    assert callable(_private.jax_initialize_rng)
    assert _private_uses._BY_NAME["jax_initialize_rng"].check() == []


def test_use_jax_backends_started():
    """kmp.topology() on JAX names the devices without starting JAX (tests/jax/ check that
    simulate_devices still works after it)."""
    pytest.importorskip("jax")
    from keras_mgpu_plugins.compat import _private, _private_uses

    assert _private_uses._BY_NAME["jax_backends_started"].check() == []
    assert isinstance(_private.jax_backends_started(), bool)


def test_use_jax_distribute_data():
    """Keras's JAX `_distribute_data`, which kmp wraps to feed a batch that does not divide over
    the devices whole (tests/jax/test_parity.py runs it; here the check, and that the source
    still holds it where JAX is not installed)."""
    pytest.importorskip("jax")
    from keras_mgpu_plugins.compat import _private_uses

    assert _private_uses._BY_NAME["jax_distribute_data"].check() == []


def test_use_jax_coordination_client():
    """jax.distributed's key-value store, where kmp checks that every process makes the same
    fit/evaluate/predict call (tests/jax/test_calls.py runs it across 2 processes)."""
    pytest.importorskip("jax")
    from keras_mgpu_plugins.compat import _private, _private_uses

    assert _private_uses._BY_NAME["jax_coordination_client"].check() == []
    assert _private.jax_coordination_client() is None  # no jax.distributed in this process


def test_use_jax_variable_relayout():
    """A Keras JAX variable made outside a distribution laid out as one made under it, value
    kept (tests/jax/test_fine_tuning.py: an optimizer made outside the model's distribution)."""
    pytest.importorskip("jax")
    import jax

    from keras_mgpu_plugins.compat import _private, _private_uses

    assert _private_uses._BY_NAME["jax_variable_relayout"].check() == []
    if keras.backend.backend() != "jax" or len(jax.devices()) < 2:
        pytest.skip("needs the JAX backend and 2 devices")
    variable = keras.Variable(np.arange(4.0, dtype="float32"))
    distribution = keras.distribution.DataParallel()
    _private.jax_relayout(variable, distribution.get_variable_layout(variable))
    assert len(variable.value.sharding.device_set) == len(jax.devices())
    np.testing.assert_array_equal(np.asarray(variable.value), np.arange(4.0))


def test_use_flatten_layers():
    inner = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(name="bn_in")])
    outer = keras.Sequential([keras.Input((3,)), inner, keras.layers.BatchNormalization(name="bn")])
    names = [layer.name for layer in compat.all_layers(outer)]
    assert "bn_in" in names and "bn" in names and outer.name not in names


def test_names_the_patches_replace_are_there():
    """`PATCHES` (tested for real by tests/multi_worker/test_fit.py) replace these names."""
    from keras_mgpu_plugins.compat._names import resolve

    trainer, tf_trainer = resolve("tensorflow trainer"), resolve("tensorflow trainer module")
    assert trainer.__module__ == tf_trainer.__name__ and issubclass(keras.Model, trainer)
    assert list(inspect.signature(trainer._maybe_symbolic_build).parameters) == [
        "self", "iterator", "data_batch"]
    assert "data_batch" in inspect.signature(trainer._symbolic_build).parameters
    assert list(inspect.signature(tf_trainer.reduce_per_replica).parameters) == [
        "values", "strategy", "reduction"]
    assert callable(tf_trainer._collective_all_reduce_multi_worker)
    assert all(patch.applies_to(patch.installed_version()) is not prerelease(patch.library)
               for patch in compat.PATCHES)


def test_names_the_fit_setting_patches_use_are_there():
    """`_compat_fit` (tested for real by tests/multi_device/test_fit_settings.py) uses these."""
    from keras_mgpu_plugins.compat._names import resolve

    StatelessScope = resolve("stateless scope")  # noqa: N806 - a class
    optimizer = resolve("tensorflow optimizer")
    assert list(inspect.signature(optimizer._distributed_tf_update_step).parameters) == [
        "self", "distribution", "grads_and_vars", "learning_rate"]
    assert list(inspect.signature(optimizer._backend_apply_gradients).parameters) == [
        "self", "grads", "trainable_variables"]
    for name in ("_clip_gradients", "_get_variable_index", "_use_weight_decay",
                 "_update_model_variables_moving_average",
                 "_overwrite_model_variables_with_average_value", "_all_reduce_sum_gradients",
                 "_apply_weight_decay", "_backend_update_step"):
        assert callable(getattr(optimizer, name)), name
    opt = keras.optimizers.SGD(gradient_accumulation_steps=2)
    opt.build([keras.Variable(1.0)])
    assert len(opt._accumulated_gradients) == 1 and int(opt._iterations) == 0
    assert isinstance(StatelessScope().state_mapping, dict)


POOL_EXITS = """
import ctypes, os, signal
from keras.src.trainers.data_adapters import py_dataset_adapter as adapter
from keras_mgpu_plugins import compat
if {patched}:
    compat.patch_keras()
# What TensorFlow's preemption notifier does under MultiWorkerMirroredStrategy: a SIGTERM
# handler installed outside Python (here: ignore), which Python still reports as SIG_DFL.
ctypes.CDLL(None).signal(signal.SIGTERM, ctypes.c_void_p(1))  # SIG_IGN
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
class One(keras.utils.PyDataset):
    def __len__(self):
        return 1
enqueuer = adapter.OrderedEnqueuer(One(), workers=2, use_multiprocessing=True)
pool = enqueuer._get_executor_init(2)({{}})
# A worker that ran a task has run the pool's initializer (where the patch acts); another may
# still be starting, with the inherited handler.
pid = pool.apply_async(os.getpid).get(timeout=60)
worker = next(w for w in pool._pool if w.pid == pid)
worker.terminate()  # SIGTERM: what multiprocessing sends the pool's workers at shutdown
# Poll rather than join: the pool's own thread reaps its dead workers too, and a join racing
# it can return at once with no exit code yet (its waitpid fails with ECHILD).
import time
end = time.monotonic() + {deadline}
while worker.exitcode is None and time.monotonic() < end:
    time.sleep(0.05)
print("stopped" if worker.exitcode is not None else "stuck", flush=True)
for worker in pool._pool:  # the stuck ones would hold the output pipe open
    if worker.exitcode is None:
        os.kill(worker.pid, signal.SIGKILL)
os._exit(0)
"""


def pool_exits(patched, deadline, tmp_path):
    """Runs POOL_EXITS in a session of its own, its output to a file, and kills what it leaves.

    The pool forks a replacement for the worker it lost; one forked after the script's last
    look outlives it. A pipe it held would keep `subprocess.run` waiting until its timeout."""
    import os
    import signal
    import subprocess
    import sys

    code = "import keras\n" + POOL_EXITS.format(patched=patched, deadline=deadline)
    log = tmp_path / f"pool-{patched}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=240)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the leftover workers, if any
            except ProcessLookupError:
                pass
    text = log.read_text()
    assert returncode == 0, text[-2000:]
    return text.strip().splitlines()[-1]


def test_py_dataset_pool_workers_stop_on_sigterm_under_a_foreign_handler(tmp_path):
    """py_dataset_pool_default_sigterm: Keras's forked PyDataset workers inherit a SIGTERM
    handler set outside Python (TensorFlow's, on several workers) and the pool's shutdown waits
    for them forever; patched, they stop. tests/multi_worker/test_fit_settings.py runs it on 2
    workers."""
    assert pool_exits(patched=True, deadline=120, tmp_path=tmp_path) == "stopped"
    assert pool_exits(patched=False, deadline=10, tmp_path=tmp_path) == "stuck"  # drop the patch when this stops


def test_the_code_each_patch_fixes_is_in_the_installed_keras():
    """Each patch's `present` check sees the upstream code it replaces (before patching)."""
    compat.unpatch_keras()
    try:
        assert {p.name: p.present() for p in compat.PATCHES} == {p.name: True for p in compat.PATCHES}
    finally:
        compat.patch_keras()


@pytest.fixture
def unpatched(monkeypatch):
    """No patch applied and no patch warning given; the real state is restored after."""
    compat.unpatch_keras()
    monkeypatch.setattr(_compat_patches, "_warned_patches", set())
    yield
    compat.unpatch_keras()
    monkeypatch.undo()
    compat.patch_keras()


def pretend(monkeypatch, version, present, library="keras"):
    """Another `library` version; only that library's workarounds are in the table."""
    if library == "keras":
        monkeypatch.setattr(keras, "__version__", version)
    else:
        import tensorflow as tf

        monkeypatch.setattr(tf, "__version__", version)
    patches = tuple(dataclasses.replace(p, present=lambda: present) for p in compat.PATCHES
                    if p.library == library and p.kind == "workaround")
    monkeypatch.setattr(_compat_patches, "PATCHES", patches)  # where patch_keras reads it


TENSORFLOW_PATCHES = ["full_batch_executions_skip_input_check", "one_multi_worker_strategy",
                      "numpy_function_owned_outputs"]


def results_changing(library="keras"):
    return [p.name for p in compat.PATCHES
            if p.library == library and p.changes_results and p.kind == "workaround"]


def test_the_patches_that_change_results_are_classified():
    """Fail-closed patches: without them the numbers differ from one device (not a crash)."""
    assert set(results_changing("keras")) >= {
        "loss_scale_global_finiteness", "clip_after_all_reduce", "compile_in_model_strategy_scope",
        "symbolic_build_from_element_spec"}
    assert results_changing("tensorflow") == ["numpy_function_owned_outputs"]
    assert not {"symbolic_build_per_replica_batch", "steps_per_execution_under_distribution",
                "jit_compile_per_replica"} & set(results_changing("keras"))


def patch_quietly():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        applied = compat.patch_keras()
    return applied, [str(w.message) for w in caught if "kmp.compat" in str(w.message)
                     or "keras_mgpu_plugins was not checked" in str(w.message)]


@pytest.mark.parametrize(("version", "present", "allow", "applied", "note"), [
    ("2.15.1", True, False, [], None),
    ("2.21.0", True, False, TENSORFLOW_PATCHES, None),
    ("2.22.0", True, True, TENSORFLOW_PATCHES, "TensorFlow 2.22.0 still has the code it fixes"),
    ("2.22.0", False, True, [], "TensorFlow 2.22.0 no longer has the code it fixes"),
])
def test_a_tensorflow_patch_follows_the_tensorflow_version(monkeypatch, unpatched, version, present,
                                                           allow, applied, note):
    """TensorFlow patches are guarded by TensorFlow's version, not Keras's."""
    assert [p.name for p in compat.PATCHES if p.library == "tensorflow"] == TENSORFLOW_PATCHES
    pretend(monkeypatch, version, present, library="tensorflow")
    if allow:
        monkeypatch.setenv(compat.ALLOW_UNCHECKED_ENV, "1")
    done, notes = patch_quietly()
    assert done == applied
    assert len(notes) == (0 if note is None else 1)
    if note:
        assert notes[0].count(note) == len(TENSORFLOW_PATCHES)
        assert notes[0].count("checked for TensorFlow >=2.16.0,<2.22.0") == len(TENSORFLOW_PATCHES)


@pytest.mark.parametrize(("library", "version"), [
    ("tensorflow", "2.22.0"), ("tensorflow", "2.22.0-dev20261101"), ("tensorflow", "2.21.0rc1"),
    ("keras", "3.16.0"), ("keras", "3.16.0rc0"), ("keras", "3.16.0.dev2026110103"),
    ("keras", "3.15.0rc1"),
])
def test_a_patch_that_changes_results_fails_closed_outside_its_range(monkeypatch, unpatched,
                                                                     library, version):
    """Newer versions and every pre-release: refused by name, with the range and the switch."""
    pretend(monkeypatch, version, present=True, library=library)
    monkeypatch.delenv(compat.ALLOW_UNCHECKED_ENV, raising=False)
    with pytest.raises(compat.UncheckedVersionError) as raised:
        compat.patch_keras()
    message = str(raised.value)
    if library == "keras":  # the version policy of every lane decides first (compat._policy)
        assert message.startswith(f"keras_mgpu_plugins was not checked with Keras {version} "
                                  "on the TensorFlow lane")
    else:
        for name in results_changing(library):
            assert f"{name} (" in message
        assert f"still has the code it fixes; checked for {_compat_patches._LIBRARY_NAMES[library]} >=" in message
    assert "KMP_ALLOW_UNCHECKED_VERSIONS=1" in message
    assert _compat_patches._applied == {}  # nothing half-applied


def test_a_patch_that_changes_results_whose_code_is_gone_fails_closed(monkeypatch, unpatched):
    """In the checked range too: a results patch that cannot find its code is not skipped."""
    pretend(monkeypatch, "3.15.1", present=False)
    monkeypatch.delenv(compat.ALLOW_UNCHECKED_ENV, raising=False)
    with pytest.raises(compat.UncheckedVersionError, match="no longer has the code it fixes"):
        compat.patch_keras()


@pytest.mark.parametrize("version", ["3.2.0", "3.4.1", "3.9.0", "3.10.0rc1"])
def test_patch_keras_refuses_keras_older_than_the_supported_range(monkeypatch, unpatched, version):
    pretend(monkeypatch, version, present=True)
    with pytest.raises(RuntimeError, match=r"needs Keras >= 3\.10\.0"):
        compat.patch_keras()
    assert _compat_patches._applied == {}


def test_newer_keras_still_with_the_bug_is_patched_with_one_warning_when_allowed(monkeypatch,
                                                                                unpatched):
    pretend(monkeypatch, "3.16.0", present=True)
    monkeypatch.setenv(compat.ALLOW_UNCHECKED_ENV, "1")
    applied, notes = patch_quietly()
    assert applied == [p.name for p in _compat_patches.PATCHES]
    assert len(notes) == 1  # one line per process, not one per patch: the version policy's
    assert notes[0].startswith("keras_mgpu_plugins was not checked with Keras 3.16.0 (newer")
    assert "KMP_ALLOW_UNCHECKED_VERSIONS=1 is set" in notes[0]
    compat.unpatch_keras()
    assert patch_quietly() == (applied, [])  # no second warning


@pytest.mark.parametrize("version", ["3.15.1", "3.16.0"])
def test_keras_without_the_buggy_code_is_not_patched_and_says_so(monkeypatch, unpatched, version):
    pretend(monkeypatch, version, present=False)
    monkeypatch.setenv(compat.ALLOW_UNCHECKED_ENV, "1")
    applied, notes = patch_quietly()
    assert applied == [] and len(notes) == 1
    if version == "3.16.0":  # an unchecked Keras: the version policy's one warning says it
        assert notes[0].startswith("keras_mgpu_plugins was not checked with Keras 3.16.0")
        return
    assert notes[0].count(f"Keras {version} no longer has the code it fixes") == len(
        _compat_patches.PATCHES)


# --- the version policy ------------------------------------------------------------------


@pytest.mark.parametrize("version", ["3.16.0", "3.16.0rc0", "3.15.0.dev2026110103"])
def test_newer_keras_with_the_api_still_there_goes_on_with_one_warning(monkeypatch, version):
    """A pre-release is never taken for a checked version, even where it sorts inside the range."""
    monkeypatch.setattr(keras, "__version__", version)
    monkeypatch.setattr(_keras_private, "_warned", set())
    monkeypatch.setattr(_policy, "_announced", [])
    with pytest.warns(UserWarning, match=rf"not checked with Keras {version} \(.*checked: "
                                         r"Keras >=3.10.0,<3.16.0\)"):
        assert compat.require("model_checkpoint_hooks") is True  # the policy's one warning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.require("model_checkpoint_hooks") is True  # once


def test_require_checks_once_per_keras_version(monkeypatch):
    """The check runs once per (use, Keras version); another version string checks again."""
    use, seen = _keras_private._BY_NAME["flatten_layers"], []

    def counted():
        seen.append(keras.__version__)
        return use.check()

    monkeypatch.setitem(_keras_private._BY_NAME, use.name, dataclasses.replace(use, check=counted))
    installed = keras.__version__
    assert compat.require(use.name) is True and compat.require(use.name) is True
    assert seen == [installed]
    monkeypatch.setattr(keras, "__version__", "3.14.0")
    assert compat.require(use.name) is True and compat.require(use.name) is True
    assert seen == [installed, "3.14.0"]
    monkeypatch.setattr(keras, "__version__", installed)
    assert compat.require(use.name) is True
    assert seen == [installed, "3.14.0"]
    # a failing check is cached too: the error comes back without checking again
    monkeypatch.setattr(keras, "__version__", "3.1.0")
    monkeypatch.setitem(_keras_private._BY_NAME, use.name, dataclasses.replace(
        use, check=lambda: seen.append("broken") or ["Layer._flatten_layers is missing"]))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="_flatten_layers is missing"):
            compat.require(use.name)
    assert seen == [installed, "3.14.0", "broken"]
    assert compat.check_private_uses()[use.name] == []  # reads Keras, not require's cache


def test_keras_older_than_the_range_is_refused(monkeypatch):
    monkeypatch.setattr(keras, "__version__", "3.9.0")
    with pytest.raises(RuntimeError, match=r"known not to hold before Keras 3.10.0.*keras.callbacks"):
        ModelCheckpoint("m.keras")


def test_a_missing_hook_fails_loudly_by_name(monkeypatch):
    monkeypatch.delattr(keras.callbacks.ModelCheckpoint, "_should_save_model")
    with pytest.raises(RuntimeError, match=r"ModelCheckpoint._should_save_model is missing"):
        ModelCheckpoint("m.keras")


def test_a_reshaped_hook_or_a_hook_no_longer_called_fails_loudly(monkeypatch):
    base = keras.callbacks.ModelCheckpoint
    monkeypatch.setattr(base, "_get_file_path", lambda self, epoch, logs: "")
    monkeypatch.setattr(base, "on_epoch_end", lambda self, epoch, logs=None: None)
    problems = compat.check_private_uses()["model_checkpoint_hooks"]
    assert problems == [
        "keras.callbacks.ModelCheckpoint._get_file_path('self', 'epoch', 'logs') is not "
        "_get_file_path('self', 'epoch', 'batch', 'logs')",
        "keras.callbacks.ModelCheckpoint.on_epoch_end no longer calls self._save_model",
    ]


def test_a_missing_fit_attribute_fails_loudly(monkeypatch):
    monkeypatch.setattr(keras.Model, "fit", lambda self, *a, **k: None)
    model, _, _ = tiny_model()
    with pytest.raises(RuntimeError, match="fit no longer reads self._initial_epoch"):
        compat.set_initial_epoch(model, 1)


# --- nothing else reaches into Keras -----------------------------------------------------

#: Known private imports (none but a protobuf message module, below).
ALLOWED_ELSEWHERE: set[tuple[str, str]] = set()


def package_files():
    return [p for p in PACKAGE.rglob("*.py") if not in_compat(p)]


#: What is private in TensorFlow, Keras and JAX: their implementation packages, and
#: `tf.__internal__` (TensorFlow's own private namespace, reached as an attribute).
PRIVATE_MODULES = ("keras.src", "tensorflow.python", "tensorflow.core", "tensorflow.compiler",
                   "tensorflow.tsl", "jax._src")


def private_names(path):
    """Private modules `path` imports, and `tf.__internal__` uses, as dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [f"{node.module}.{a.name}" for a in node.names]
            if isinstance(node, ast.ImportFrom) else [])
        found |= {name for name in names if name.startswith(PRIVATE_MODULES)}
        if isinstance(node, ast.Attribute) and node.attr == "__internal__":
            found.add(ast.unparse(node).replace("tf.", "tensorflow.", 1))
    return found


#: A protobuf message module (the TensorBoard summary metadata), not behaviour.
ALLOWED_ELSEWHERE |= {("tensorboard.py", "tensorflow.core.framework.summary_pb2")}


def test_no_module_imports_keras_tensorflow_or_jax_internals():
    """Not even compat's: every private name is reached through `compat._names.resolve`,
    which knows where each one lived in each version."""
    found = {(path.name, name) for path in PACKAGE.rglob("*.py") for name in private_names(path)}
    assert found == ALLOWED_ELSEWHERE


#: compat's functions that take private-name keys (`compat._names.NAMES`) as arguments.
KEY_TAKERS = {"resolve", "missing", "check_names", "_missing", "find", "path_of", "available"}


def keys_in_code() -> set[str]:
    """The string constants the package passes to KEY_TAKERS that are no dotted path."""
    keys = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", None)
            if func in KEY_TAKERS:
                keys |= {a.value for a in node.args if isinstance(a, ast.Constant)
                         and isinstance(a.value, str) and "." not in a.value}
    return keys


def test_every_private_name_kmp_touches_is_registered_with_its_history():
    """Each key the code resolves, and each a patch wraps, is a `PrivateName`; each
    `PrivateName` is used; `PRIVATE_USES` name what they touch by these keys."""
    from keras_mgpu_plugins.compat import _checks, _names

    wrapped = {w.split(".", 1)[0] for p in compat.PATCHES for w in p.wraps}
    described = {w for w in wrapped if "multi_gpu_model's" in w}  # per-instance, described
    assert {w for w in wrapped - described if " " in w} <= set(_names.BY_KEY)
    used = (keys_in_code() | (wrapped & set(_names.BY_KEY)) | set(_checks.PATCH_INTERNALS)
            | set(_checks.TRAINER_MODULES))
    assert used - set(_names.BY_KEY) == set()
    assert set(_names.BY_KEY) - used == set()
    for name in _names.NAMES:
        assert name.library in ("keras", "tensorflow", "jax") and name.history, name.key
        assert [since for since, _ in name.history] == sorted(
            (since for since, _ in name.history), key=Version), name.key
    for patch in compat.PATCHES:  # a class/module patch's every target is checked
        assert patch.per_instance or patch.targets() == patch.wraps, patch.name


def keras_private_names(cls) -> set[str]:
    """Private names Keras's classes define or use on `self`, along `cls`'s Keras MRO."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras"):
            names |= {n for n in vars(klass) if n.startswith("_") and not n.startswith("__")}
            names |= set(re.findall(r"self\.(_[a-z]\w*)", class_source(klass)))
    return names


def class_source(klass) -> str:
    """`klass`'s source; where its `__module__` was reassigned (keras-nightly re-exports
    `keras.Variable` so, and `inspect.getsource` cannot find it), its functions' sources."""
    try:
        return inspect.getsource(klass)
    except OSError:
        functions = [f for f in vars(klass).values() if inspect.isfunction(f)]
        assert functions, klass
        return "\n".join(inspect.getsource(f) for f in functions)


#: Subclasses that override every Keras hook, so they may own Keras's state names.
OWNS_KERAS_STATE = {"BackupAndRestore"}


def test_subclasses_use_only_the_declared_private_hooks():
    reached = {}
    for path in package_files():
        for cls in [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]:
            bases = [ast.unparse(b) for b in cls.bases if ast.unparse(b).startswith("keras.")]
            if not bases:
                continue
            keras_names = keras_private_names(eval(bases[0], {"keras": keras}))
            defined = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
            used = set(re.findall(r"self\.(_[a-z]\w*)", ast.unparse(cls)))
            shared = (defined | used) & keras_names
            declared = set(compat.KERAS_PRIVATE_HOOKS.get(bases[0], ()))
            if cls.name in OWNS_KERAS_STATE:
                init = next(f for f in cls.body if getattr(f, "name", "") == "__init__")
                declared |= set(re.findall(r"self\.(_[a-z]\w*)", ast.unparse(init)))
            if shared - declared:
                reached[cls.name] = sorted(shared - declared)
    assert reached == {}


def test_no_module_reads_private_attributes_of_keras_objects():
    keras_names = set()
    for cls in (keras.Model, keras.metrics.Mean, keras.callbacks.CallbackList,
                keras.callbacks.History, keras.optimizers.Optimizer, keras.Variable):
        keras_names |= keras_private_names(cls)
    found = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in keras_names
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert found == []


def test_backup_and_restore_runs_no_keras_hook():
    """It may own Keras's state names only because no Keras hook of its base runs."""
    keras_hooks = {n for n in vars(keras.callbacks.BackupAndRestore) if n.startswith("on_")}
    assert keras_hooks <= set(vars(BackupAndRestore)), keras_hooks - set(vars(BackupAndRestore))


def test_use_model_parallel_graph():
    """The graph hook places each node's call; move_variable keeps path and value."""
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow.patches import functional_graph as private

    assert private.require("model_parallel_graph")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="a"),
                              keras.layers.Dense(1, name="b")])
    graph = private.graph_of(model)
    assert [n.operation.name for n in private.call_nodes(graph)] == ["a", "b"]
    assert private.node_of(model.outputs[0]) is private.call_nodes(graph)[-1]
    kernel = model.get_layer("b").kernel
    before, path, name = kernel.numpy(), kernel.path, kernel.value.name
    private.move_variable(kernel, "/device:CPU:1")
    assert kernel.value.device.endswith("CPU:1")
    assert (kernel.path, kernel.value.name) == (path, name)
    np.testing.assert_array_equal(kernel.numpy(), before)
    devices = []

    def make(operation_fn):
        def placed(op):
            inner = operation_fn(op)

            def call(*args, **kwargs):
                with tf.device("/cpu:1"):
                    out = inner(*args, **kwargs)
                devices.append(out.device)
                return out
            return call
        return placed

    private.hook_graph_run(graph, make)
    tf.function(lambda x: model(x))(tf.ones((1, 3)))
    assert len(devices) == 2 and all(d.endswith("CPU:1") for d in devices)


def numpy_function_overwrites_its_source():
    """Whether a MirroredStrategy step on a `tf.numpy_function`'s output writes into the NumPy
    array the function returned (64-byte aligned, so TensorFlow takes it without a copy)."""
    import tensorflow as tf

    from tests.fit_settings_scenarios import aligned

    want = np.arange(1.0, 17.0, dtype="float32").reshape(16, 1)
    source = aligned(want)
    steps = 8  # whether TensorFlow reuses the buffer depends on who else holds it at the time
    dataset = tf.data.Dataset.range(steps).map(
        lambda i: tf.numpy_function(lambda i: source, [i], tf.float32))
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])  # conftest's 2 devices
    iterator = iter(strategy.experimental_distribute_dataset(dataset))  # each replica: 8 rows

    @tf.function
    def step(iterator):
        return strategy.run(lambda batch: tf.reduce_sum(tf.square(batch - 0.5)), (next(iterator),))

    for _ in range(steps):
        step(iterator)
    return not np.array_equal(source, want)


def test_numpy_function_outputs_are_copied_before_tensorflow_takes_them(unpatched):
    """numpy_function_owned_outputs: TensorFlow's bug, not Keras's (no Keras in this test)."""
    assert numpy_function_overwrites_its_source(), "unpatched TensorFlow kept the array: drop the patch?"
    compat.patch_keras()
    assert "numpy_function_owned_outputs" in _compat_patches._applied, _compat_patches._applied
    assert not numpy_function_overwrites_its_source(), "patched, TensorFlow still wrote into it"


def test_use_collective_all_reduce_multi_worker():
    """`distributing` asks Keras's own multi-worker test: False for one device."""
    import tensorflow as tf

    assert compat.distributing(tf.distribute.get_strategy()) is False


def test_use_patch_internals():
    from keras.src import tree

    assert tree.flatten({"a": (1, 2)}) == [1, 2]


def test_use_distributed_element_spec():
    """The epoch iterator's distributed dataset states each replica's spec (a static batch
    halved on 2 replicas): what the model is built from (tests/multi_device/
    test_reshuffled_input.py trains with it)."""
    import tensorflow as tf

    from keras_mgpu_plugins.compat._names import resolve

    def factory():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    x = np.zeros((16, 3), "float32")
    strategy = kmp.parallelize(strategy="mirrored")(factory)().distribute_strategy
    iterator = resolve("tensorflow epoch iterator")(
        x=tf.data.Dataset.from_tensor_slices((x, x)).batch(8, drop_remainder=True),
        distribute_strategy=strategy)
    spec, _ = iterator._distributed_dataset.element_spec
    assert isinstance(spec, resolve("per replica spec"))
    assert [s.shape.as_list() for s in spec._value_specs] == [[4, 3], [4, 3]]


def test_use_eager_context():
    """The device scope read from TensorFlow's eager context, and this process's task."""
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow.patches import functional_graph as _compat_graph

    with tf.device("/device:CPU:0"):
        assert _compat_graph.current_device().endswith("CPU:0")
    assert compat.collective_ops_configured() in (True, False)


def test_use_tf_coordination_store():
    """One process runs no coordination service: no store, no warning; TensorFlow's get takes
    a timeout. The store itself, between 2 workers: tests/multi_worker/test_calls.py."""
    import inspect
    import warnings

    from tensorflow.python.eager import context

    from keras_mgpu_plugins.compat._private import tf_coordination_context

    assert "timeout_in_ms" in inspect.signature(context.Context.get_config_key_value).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.require("tf_coordination_store") is True
        assert tf_coordination_context() is None
    assert context.context().coordination_service is None


def test_use_tf_maybe_merge_call():
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    assert tf.__internal__.distribute.interim.maybe_merge_call(
        lambda s, x: x + 1, strategy, tf.constant(1)).numpy() == 2


def test_use_distributed_input_lib():
    from tensorflow.python.distribute import input_lib

    assert callable(input_lib.DistributedIterator.get_next_as_optional)


# --- the torch lane's uses (their behaviour in a real job: tests/torch) ---------------------


def test_use_torch_default_store():
    pytest.importorskip("torch")
    import torch.distributed as dist

    store = dist.HashStore()  # the store type behind a default group's is the same interface
    store.set("kmp/calls/0/0", "fit")
    assert store.check(["kmp/calls/0/0"]) and not store.check(["kmp/calls/0/1"])
    from keras_mgpu_plugins.compat import _torch

    assert callable(_torch.default_store)


def test_use_batchnorm_moments():
    layer = keras.layers.BatchNormalization()
    layer.build((None, 3, 4))
    assert list(layer._reduction_axes) == [0, 1]
    mean, variance = layer._moments(np.ones((2, 3, 4), "float32"), None)
    assert tuple(mean.shape) == tuple(variance.shape) == (4,)


def test_use_torch_upstream_ddp():
    from keras_mgpu_plugins.compat import _torch

    expected = keras.backend.backend() == "torch" and "dev" in keras.__version__
    assert _torch.keras_has_upstream_ddp() is expected  # releases up to 3.15: none
