"""kmp.callbacks.ModelCheckpoint on one device: Keras's behaviour, to the file and the bit.

In the spirit of Keras's own `model_checkpoint_test.py`: real fits of a tiny
model, then assertions on which files exist, what they hold and what was
printed or warned. The parity tests run the same fit twice, once with
`keras.callbacks.ModelCheckpoint` and once with ours, and compare the files,
their content (weights and optimizer state, bit for bit) and the messages.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import keras
import numpy as np
import pytest
from packaging.version import Version

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.callbacks import events
from keras_mgpu_plugins.callbacks._checkpoint_rules import (
    agreed_logs,
    encode_monitored,
    monitored_value,
)
from keras_mgpu_plugins.callbacks.model_checkpoint import ModelCheckpoint
from keras_mgpu_plugins.callbacks.parallel_model_checkpoint import ParallelModelCheckpoint
from keras_mgpu_plugins.io import atomic
from keras_mgpu_plugins.io.snapshots import copy_weights
from tests.versions import without_expected_notes

INPUT_DIM, NUM_CLASSES, BATCH = 3, 3, 5
#: Keras 3.11 moved `ModelCheckpoint` onto `MonitorCallback` (keras-team/keras#21275): `mode`
#: and `min_delta` kept, `best` starts at None, `mode="auto"` is decided from the model's
#: metrics at the first epoch end (an unknown metric raises). Keras 3.10 decides `monitor_op`
#: in `__init__` ("acc" in the name: max, else min), `best` starts at -inf/inf, and it prints no
#: "finished saving model" line. The drop-in does what the installed Keras does.
MONITOR_CALLBACK = Version(keras.__version__) >= Version("3.11")


def get_data(n=30, seed=42):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, INPUT_DIM)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, NUM_CLASSES, n), NUM_CLASSES)
    return x, y


def get_model(seed=0):
    model = keras.Sequential(
        [
            keras.Input((INPUT_DIM,)),
            keras.layers.Dense(5, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed)),
            keras.layers.Dense(NUM_CLASSES, activation="softmax", kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
        ]
    )
    model.compile(
        loss="categorical_crossentropy",
        optimizer=keras.optimizers.Adam(0.01),
        metrics=[keras.metrics.CategoricalAccuracy("acc")],
    )
    return model


def fit(model, callbacks, epochs=3, batch_size=BATCH, verbose=0):
    x, y = get_data()
    xv, yv = get_data(seed=7)
    return model.fit(
        x, y, batch_size=batch_size, validation_data=(xv, yv), callbacks=callbacks,
        epochs=epochs, verbose=verbose, shuffle=False,
    )


def files(folder):
    return sorted(os.listdir(folder))


def load(path, weights_only):
    if weights_only:
        model = get_model()
        model.optimizer.build(model.trainable_variables)  # so its state is loaded too
        model.load_weights(path)
        return model
    return keras.saving.load_model(path, compile=not path.endswith(".h5"))


def assert_same_arrays(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


# --- pure decision helpers ------------------------------------------------------


def test_encode_monitored_kinds():
    np.testing.assert_array_equal(encode_monitored(None), [0.0, 0.0])
    np.testing.assert_array_equal(encode_monitored(0.25), [1.0, 0.25])
    np.testing.assert_array_equal(encode_monitored(np.float32(0.5)), [1.0, 0.5])
    np.testing.assert_array_equal(encode_monitored(3), [1.0, 3.0])
    np.testing.assert_array_equal(encode_monitored(np.array([1.0, 2.0])), [2.0, 0.0])
    assert encode_monitored(0.1).dtype == np.float64  # exact on the wire
    assert monitored_value(encode_monitored(np.float32(0.5))) == 0.5
    assert monitored_value(encode_monitored(None)) is None
    assert monitored_value(encode_monitored(np.zeros(2))) is None


def test_agreed_logs_keeps_a_worker_that_holds_the_chiefs_value_untouched():
    logs = {"val_loss": np.float32(0.5), "loss": 1.0}
    out = agreed_logs(logs, "val_loss", encode_monitored(np.float32(0.5)))
    assert out == logs and type(out["val_loss"]) is np.float32


def test_agreed_logs_takes_the_chiefs_value_or_its_absence():
    logs = {"custom": 10.0, "loss": 1.0}
    assert agreed_logs(logs, "custom", encode_monitored(3.0)) == {"custom": 3.0, "loss": 1.0}
    assert agreed_logs(logs, "custom", encode_monitored(None)) == {"loss": 1.0}
    assert agreed_logs({"loss": 1.0}, "custom", encode_monitored(2.0))["custom"] == 2.0
    out = agreed_logs(logs, "custom", encode_monitored(np.zeros(3)))  # chief: not a scalar
    assert np.asarray(out["custom"]).ndim == 1
    assert logs == {"custom": 10.0, "loss": 1.0}  # the caller's logs are not changed


@pytest.mark.slow  # a real fit
def test_copy_weights_copies_values_not_variables(monkeypatch):
    trained, template = get_model(seed=1), get_model(seed=5)
    with monkeypatch.context() as patched:  # reads and assigns: no NumPy round trip
        for name in ("get_weights", "set_weights"):
            patched.setattr(keras.Model, name, lambda *a, name=name: pytest.fail(name))
        reads = copy_weights(trained, template)
    assert_same_arrays([np.asarray(r) for r in reads], trained.get_weights())
    assert_same_arrays(template.get_weights(), trained.get_weights())
    assert not {id(v) for v in template.weights} & {id(v) for v in trained.weights}
    fit(trained, [], epochs=1)  # training the source later does not move the copy
    assert not np.array_equal(template.get_weights()[0], trained.get_weights()[0])


def test_copy_weights_refuses_another_structure():
    other = keras.Sequential([keras.Input((INPUT_DIM,)), keras.layers.Dense(4)])
    with pytest.raises(ValueError, match=r"2 weights of shapes \[\(3, 4\), \(4,\)\]"):
        copy_weights(get_model(), other)


# --- constructor: Keras's errors and warnings, ours for our arguments ------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"filepath": "m.keras", "save_freq": "invalid_save_freq"},
        {"filepath": "m.keras", "save_weights_only": True},
        {"filepath": "m.h5", "save_weights_only": True},
        {"filepath": "m.weights", "save_weights_only": False},
        {"filepath": "m.txt"},
        {"filepath": "m.hdf5"},
        {"filepath": "m.keras", "save_freq": 2.5},
    ],
    ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()),
)
def test_bad_arguments_raise_what_keras_raises(kwargs):
    with pytest.raises(Exception) as theirs:
        keras.callbacks.ModelCheckpoint(**kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        ModelCheckpoint(**kwargs)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"filepath": "m.keras"},
        {"filepath": "m.weights.h5", "save_weights_only": True, "save_freq": 3},
        {"filepath": "{epoch:02d}.h5", "monitor": "val_acc", "mode": "max", "save_best_only": True},
        {"filepath": "m.keras", "initial_value_threshold": 0.3, "verbose": 1},
    ],
)
def test_accepted_arguments_set_what_keras_sets(kwargs):
    assert_sets_what_keras_sets(ModelCheckpoint(**kwargs), keras.callbacks.ModelCheckpoint(**kwargs))


def assert_sets_what_keras_sets(ours, theirs):
    """Every attribute the installed Keras's callback sets from its arguments, ours equal."""
    names = [name for name in ("filepath", "monitor", "mode", "best", "verbose", "save_best_only",
                               "save_weights_only", "save_freq", "min_delta", "monitor_op")
             if hasattr(theirs, name)]
    assert ({"mode", "min_delta"} <= set(names)) if MONITOR_CALLBACK else ("monitor_op" in names)
    for name in names:
        assert getattr(ours, name) == getattr(theirs, name), name


def test_unknown_mode_warns_as_keras():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ModelCheckpoint("m.keras", mode="unknown")
    assert "ModelCheckpoint mode 'unknown' is unknown, fallback to auto mode." in [
        str(w.message) for w in caught
    ]


def test_our_arguments_are_checked():
    with pytest.raises(TypeError, match="Received: model='template.keras'"):
        ModelCheckpoint("m.keras", model="template.keras")
    with pytest.raises(ValueError, match="Received: async_save='yes'"):
        ModelCheckpoint("m.keras", async_save="yes")
    with pytest.raises(TypeError, match="Received: model=None"):
        ParallelModelCheckpoint(None, "m.keras")
    with pytest.raises(TypeError, match="multiple values for argument 'model'"):
        ParallelModelCheckpoint(get_model(), "m.keras", model=get_model())


def test_parallel_model_checkpoint_takes_the_template_first_then_keras_order():
    template = get_model()
    callback = ParallelModelCheckpoint(template, "m.keras", "val_loss", 1, True, False, "max")
    assert callback.template is template and callback.filepath == "m.keras"
    assert (callback.monitor, callback.verbose, callback.save_best_only) == ("val_loss", 1, True)
    # "max" reached Keras's `mode` (its default for val_loss would be min)
    theirs = keras.callbacks.ModelCheckpoint("m.keras", "val_loss", 1, True, False, "max")
    assert_sets_what_keras_sets(callback, theirs)
    assert (theirs.mode == "max") if MONITOR_CALLBACK else (theirs.monitor_op is np.greater)
    assert isinstance(callback, keras.callbacks.ModelCheckpoint)


# --- parity with keras.callbacks.ModelCheckpoint on real fits --------------------

PARITY_CASES = {
    "every_epoch": dict(filepath="{epoch:02d}.keras"),
    "best_val_loss_named": dict(
        filepath="{epoch:02d}-{val_loss:.4f}.weights.h5", save_weights_only=True, save_best_only=True
    ),
    "best_val_acc_max": dict(filepath="best.keras", monitor="val_acc", mode="max", save_best_only=True),
    "best_acc_auto": dict(filepath="best-{epoch}.keras", monitor="acc", save_best_only=True),
    "every_2_batches": dict(filepath="e{epoch:02d}b{batch:02d}.keras", save_freq=2),
    "every_4_batches_weights": dict(filepath="w{epoch}.weights.h5", save_freq=4, save_weights_only=True),
    "legacy_h5_threshold": dict(
        filepath="m{epoch}.h5", save_best_only=True, initial_value_threshold=1.07
    ),
    "threshold_never_beaten": dict(
        filepath="never.keras", save_best_only=True, initial_value_threshold=0.0, mode="min"
    ),
    "unknown_monitor_min": dict(filepath="u{epoch}.keras", monitor="unknown", mode="min", save_best_only=True),
}


def run_with(callback_class, folder, case, capsys, **extra):
    kwargs = dict(PARITY_CASES[case])
    kwargs["filepath"] = os.path.join(folder, kwargs["filepath"])
    keras.utils.set_random_seed(3)
    model = get_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, [callback_class(**kwargs, **extra, verbose=1)])
    printed = capsys.readouterr().out.replace(str(folder), "<dir>")
    messages = sorted({str(w.message) for w in caught if "checkpoint" in str(w.message).lower()
                       or "save best" in str(w.message).lower()})
    return model, printed, without_expected_notes(messages)


@pytest.fixture(scope="module")
def keras_runs(tmp_path_factory):
    """Keras's own callback on each parity case, run once: (folder, weights, printed, warned)."""
    cache = {}

    def get(case, capsys):
        if case not in cache:
            folder = tmp_path_factory.mktemp(case) / "keras"
            model, printed, warned = run_with(keras.callbacks.ModelCheckpoint, folder, case, capsys)
            cache[case] = (folder, model.get_weights(), printed, warned)
        return cache[case]

    return get


@pytest.mark.slow  # a real fit
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("case", sorted(PARITY_CASES))
def test_same_files_content_and_messages_as_keras(case, async_save, tmp_path, capsys, keras_runs):
    theirs_dir, ref_weights, printed_ref, warned_ref = keras_runs(case, capsys)
    ours_dir = tmp_path / "kmp"
    got, printed, warned = run_with(ModelCheckpoint, ours_dir, case, capsys, async_save=async_save)

    assert_same_arrays(got.get_weights(), ref_weights)  # the same training
    expected = files(theirs_dir) if theirs_dir.exists() else []
    assert (files(ours_dir) if ours_dir.exists() else []) == expected
    weights_only = PARITY_CASES[case].get("save_weights_only", False)
    for name in expected:
        a, b = load(str(theirs_dir / name), weights_only), load(str(ours_dir / name), weights_only)
        assert_same_arrays(b.get_weights(), a.get_weights())
        if not name.endswith(".h5") or weights_only:  # the optimizer state travels too
            assert_same_arrays(b.optimizer.variables, a.optimizer.variables)
            assert int(b.optimizer.iterations) > 0
    assert printed == printed_ref
    assert warned == warned_ref


@pytest.mark.slow  # a real fit
def test_parity_cases_cover_saving_and_not_saving(tmp_path, capsys):
    """The cases above are not vacuous: they save, skip and name files as Keras does."""
    _, printed, warned = run_with(ModelCheckpoint, tmp_path / "a", "every_2_batches", capsys)
    assert files(tmp_path / "a") == [f"e{e:02d}b{b:02d}.keras" for e in (1, 2, 3) for b in (2, 4, 6)]
    run_with(ModelCheckpoint, tmp_path / "b", "threshold_never_beaten", capsys)
    assert not (tmp_path / "b").exists()
    _, printed, warned = run_with(ModelCheckpoint, tmp_path / "c", "unknown_monitor_min", capsys)
    assert warned == ["Can save best model only with unknown available."]
    assert files(tmp_path / "c") == ["u1.keras", "u2.keras", "u3.keras"]
    _, printed, _ = run_with(ModelCheckpoint, tmp_path / "d", "best_val_acc_max", capsys)
    assert f"val_acc improved from {'None' if MONITOR_CALLBACK else '-inf'} to" in printed
    assert ("finished saving model" in printed) == MONITOR_CALLBACK


@pytest.mark.slow  # a real fit
def test_unknown_monitor_in_auto_mode_does_what_keras_does(tmp_path):
    outcomes = []
    for cls in (keras.callbacks.ModelCheckpoint, ModelCheckpoint):
        folder = tmp_path / cls.__module__.split(".")[0]
        try:
            fit(get_model(), [cls(str(folder / "m.keras"), monitor="unknown", save_best_only=True)])
            outcomes.append(("saved", files(folder)))
        except ValueError as err:
            outcomes.append(("raised", str(err), files(folder) if folder.exists() else []))
    assert outcomes[0] == outcomes[1]
    if MONITOR_CALLBACK:  # mode="auto" cannot be decided for a metric the model lacks
        assert outcomes[0][0] == "raised" and "monitor=unknown" in outcomes[0][1]
        assert outcomes[0][2] == []  # nothing written
    else:  # 3.10: min, then "Can save best model only with unknown available." and a save
        assert outcomes[0] == ("saved", ["m.keras"])


@pytest.mark.slow  # a real fit
def test_one_process_decides_on_the_very_logs_keras_would_see(tmp_path):
    seen = []

    class Recorded(ModelCheckpoint):
        def _should_save_model(self, epoch, batch, logs, filepath):
            seen.append(logs["custom"])
            return super()._should_save_model(epoch, batch, logs, filepath)

    values = [np.float32(0.5), np.float32(0.25)]
    set_custom = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: logs.__setitem__("custom", values[epoch]))
    fit(get_model(), [set_custom, Recorded(str(tmp_path / "{epoch}.keras"), monitor="custom", mode="min",
                                           save_best_only=True)], epochs=2)
    assert len(seen) == 2 and all(a is b for a, b in zip(seen, values, strict=True))
    assert files(tmp_path) == ["1.keras", "2.keras"]


@pytest.mark.slow  # a real fit
def test_existing_folder_as_filepath_raises_as_keras(tmp_path):
    (tmp_path / "taken.keras").mkdir()
    messages = []
    for cls in (keras.callbacks.ModelCheckpoint, ModelCheckpoint):
        with pytest.raises(OSError) as err:
            fit(get_model(), [cls(str(tmp_path / "taken.keras"))], epochs=1)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert files(tmp_path) == ["taken.keras"]


@pytest.mark.slow  # a real fit
def test_creates_missing_folders_and_saved_model_loads(tmp_path):
    filepath = tmp_path / "sub" / "dir" / "checkpoint.model.keras"
    model = get_model()
    fit(model, [ModelCheckpoint(str(filepath), save_best_only=True)], epochs=1)
    assert_same_arrays(keras.saving.load_model(filepath).get_weights(), model.get_weights())


# --- bad folders fail before training starts ----------------------------------------


class CountBatches(keras.callbacks.Callback):
    batches = 0

    def on_train_batch_begin(self, batch, logs=None):
        CountBatches.batches += 1


@pytest.mark.slow  # a real fit
@pytest.mark.parametrize("async_save", [False, True])
def test_unwritable_folder_fails_in_on_train_begin(tmp_path, async_save):
    (tmp_path / "a_file").write_text("not a folder")
    filepath = tmp_path / "a_file" / "ckpt" / "{epoch}.keras"
    CountBatches.batches = 0
    with pytest.raises(PermissionError, match="cannot write checkpoints") as err:
        fit(get_model(), [ModelCheckpoint(str(filepath), async_save=async_save), CountBatches()])
    assert "is not a folder" in str(err.value) and f"Received: filepath={filepath}" in str(err.value)
    assert CountBatches.batches == 0  # raised before the first step


@pytest.mark.slow  # a real fit
def test_train_begin_removes_temporaries_a_killed_save_left(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid no longer runs
    host = atomic.host_tag()
    stale = [f".1.kmp-tmp-{host}-{dead.pid}-0badf00d.keras",
             f".best.kmp-tmp-{host}-{dead.pid}-12345678.weights.h5"]
    kept = ["notes.txt", ".hidden", "old.keras"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"partial")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / stale[0]).write_bytes(b"")  # another folder: not this filepath's
    seen = []
    first_batch = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: b == 0 and seen.append(files(tmp_path)))
    fit(get_model(), [ModelCheckpoint(str(tmp_path / "{epoch}.keras")), first_batch], epochs=1)
    assert seen == [sorted(kept + ["sub"])]  # gone before training started
    assert files(tmp_path) == sorted(kept + ["1.keras", "sub"])
    assert files(tmp_path / "sub") == [stale[0]]


# --- remote filepaths (tf.io.gfile's in-memory ram:// file system) ---------------------


def gfile_files(folder):
    import tensorflow as tf

    return sorted(tf.io.gfile.listdir(folder)) if tf.io.gfile.exists(folder) else []


@pytest.mark.slow  # a real fit
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("case", ["every_epoch", "best_val_loss_named", "every_2_batches"])
def test_remote_filepath_gets_what_keras_writes_there(case, async_save, tmp_path, capsys,
                                                     monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # local scratch copies go here
    root = f"ram://kmp-{os.getpid()}-{tmp_path.name}"
    theirs, ours = f"{root}/keras", f"{root}/kmp"
    keras.utils.set_random_seed(3)
    _, printed_ref, warned_ref = run_with(keras.callbacks.ModelCheckpoint, theirs, case, capsys)
    got, printed, warned = run_with(ModelCheckpoint, ours, case, capsys, async_save=async_save)
    # No local copy left behind by either save. Checked before loading: Keras 3.10's own
    # `load_model` of a remote path leaves its local copy in the temporary folder.
    assert os.listdir(tmp_path) == []

    expected = gfile_files(theirs)
    assert expected and gfile_files(ours) == expected
    weights_only = PARITY_CASES[case].get("save_weights_only", False)
    for name in expected:
        a, b = load(f"{theirs}/{name}", weights_only), load(f"{ours}/{name}", weights_only)
        assert_same_arrays(b.get_weights(), a.get_weights())
        assert_same_arrays(b.optimizer.variables, a.optimizer.variables)
        assert int(b.optimizer.iterations) > 0  # the optimizer state was saved and loaded
    assert_same_arrays(load(f"{ours}/{expected[-1]}", weights_only).get_weights(),
                       got.get_weights())
    assert printed == printed_ref and warned == warned_ref


@pytest.mark.slow  # a real fit
def test_remote_legacy_h5_is_written_remotely(tmp_path, monkeypatch):
    # Keras's own callback writes a remote `.h5` to a local path spelled like the URL
    # (h5py opens "ram:/..."); ours writes it where filepath says.
    import tensorflow as tf

    monkeypatch.chdir(tmp_path)
    target = f"ram://kmp-{os.getpid()}-{tmp_path.name}/m.h5"
    model = get_model()
    fit(model, [ModelCheckpoint(target, async_save=True)], epochs=1)
    assert os.listdir(tmp_path) == []
    tf.io.gfile.copy(target, str(tmp_path / "m.h5"))  # Keras reads .h5 from local paths only
    assert_same_arrays(load(str(tmp_path / "m.h5"), False).get_weights(), model.get_weights())


@pytest.mark.slow  # a real fit
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_read_only_folder_fails_in_on_train_begin(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    with pytest.raises(PermissionError, match="no file can be created"):
        fit(get_model(), [ModelCheckpoint(str(folder / "m.keras"))])


# --- events ----------------------------------------------------------------------------


@pytest.mark.slow  # a real fit
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_checkpoint_saved_event_after_the_file_is_complete(tmp_path, async_save):
    model = get_model()
    seen = []

    def listener(payload):
        assert threading.current_thread() is threading.main_thread()
        assert os.path.exists(payload["path"])
        seen.append((payload, load(payload["path"], False).get_weights()))

    events.subscribe(model, "checkpoint_saved", listener)
    callback = ModelCheckpoint(str(tmp_path / "{epoch}.keras"), monitor="val_acc", mode="max",
                               save_best_only=True, async_save=async_save)
    history = fit(model, [callback], epochs=3)
    assert [p["path"] for p, _ in seen] == [str(tmp_path / n) for n in files(tmp_path)]
    improved = np.maximum.accumulate(history.history["val_acc"])
    epochs = [0] + [e for e in (1, 2) if improved[e] > improved[e - 1]]
    assert [p["epoch"] for p, _ in seen] == epochs
    for payload, _ in seen:
        assert payload["batch"] is None and payload["is_best"] is True
        assert payload["monitor"] == "val_acc"
        assert payload["value"] == history.history["val_acc"][payload["epoch"]]


@pytest.mark.slow  # a real fit
def test_event_payload_for_batch_saves_without_best(tmp_path):
    model = get_model()
    seen = []
    events.subscribe(model, "checkpoint_saved", seen.append)
    fit(model, [ModelCheckpoint(str(tmp_path / "m.weights.h5"), save_weights_only=True, save_freq=3)],
        epochs=1)
    assert [(p["epoch"], p["batch"], p["is_best"]) for p in seen] == [(0, 2, False), (0, 5, False)]
    assert [(p["monitor"], p["value"]) for p in seen] == [("val_loss", None)] * 2  # not in batch logs


# --- template models ----------------------------------------------------------------


@pytest.mark.slow  # a real fit
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_template_gets_the_trained_weights_and_is_what_is_saved(tmp_path, async_save):
    template = keras.Sequential(
        [keras.Input((INPUT_DIM,)), keras.layers.Dense(5, activation="relu"),
         keras.layers.Dense(NUM_CLASSES, activation="softmax")], name="template",
    )
    trained = get_model()
    callback = ParallelModelCheckpoint(template, str(tmp_path / "t.keras"), async_save=async_save)
    fit(trained, [callback], epochs=2)
    assert_same_arrays(template.get_weights(), trained.get_weights())
    saved = keras.saving.load_model(tmp_path / "t.keras")
    assert saved.name == "template" and getattr(saved, "optimizer", None) is None  # uncompiled
    assert_same_arrays(saved.get_weights(), trained.get_weights())


@pytest.mark.slow  # a real fit
def test_template_with_other_structure_fails_before_training(tmp_path):
    other = keras.Sequential([keras.Input((INPUT_DIM,)), keras.layers.Dense(4)], name="other")
    CountBatches.batches = 0
    with pytest.raises(ValueError, match="template 'other' has 2 weights"):
        fit(get_model(), [ModelCheckpoint(str(tmp_path / "m.keras"), model=other), CountBatches()])
    assert CountBatches.batches == 0 and not os.listdir(tmp_path)


@pytest.mark.slow  # a real fit
def test_template_sharing_the_trained_variables_is_saved_without_copy(tmp_path):
    template = get_model()
    wrapper = keras.Sequential([keras.Input((INPUT_DIM,)), template])  # shares its layers
    wrapper.compile(loss="categorical_crossentropy", optimizer="sgd")
    fit(wrapper, [ModelCheckpoint(str(tmp_path / "t.weights.h5"), model=template,
                                  save_weights_only=True)], epochs=1)
    restored = get_model(seed=9)
    restored.load_weights(tmp_path / "t.weights.h5")
    assert_same_arrays(restored.get_weights(), wrapper.get_weights())


# --- async writes ----------------------------------------------------------------------


class Unwritable(keras.layers.Layer):
    """A layer whose saved state HDF5 cannot hold (an object array)."""

    def save_own_variables(self, store):
        store["state"] = np.array([object()], dtype=object)

    def call(self, x):
        return x


@pytest.mark.slow  # a real fit
def test_async_writer_error_is_raised_on_the_training_thread_at_the_next_hook(tmp_path):
    model = keras.Sequential([keras.Input((INPUT_DIM,)), Unwritable(), keras.layers.Dense(NUM_CLASSES)])
    model.compile(loss="mse", optimizer="sgd")
    epochs_begun = []
    marker = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epochs_begun.append(e))
    callback = ModelCheckpoint(str(tmp_path / "{epoch}.weights.h5"), save_weights_only=True,
                               async_save=True)
    with pytest.raises(Exception) as err:
        fit(model, [callback, marker], epochs=5)
    assert "background writer" in "\n".join(getattr(err.value, "__notes__", []))
    assert epochs_begun in ([0], [0, 1])  # surfaced by the next epoch at the latest
    assert os.listdir(tmp_path) == []  # no file at the final name, no temporary left


@pytest.mark.slow  # a real fit
def test_async_writer_error_surfaces_at_the_next_epoch_end_when_saves_are_epochs_apart(tmp_path):
    """save_freq=18 batches (3 epochs): saves end epochs 3 and 6; the failure must not wait for 6."""
    model = keras.Sequential([keras.Input((INPUT_DIM,)), Unwritable(), keras.layers.Dense(NUM_CLASSES)])
    model.compile(loss="mse", optimizer="sgd")
    release, released = threading.Event(), []

    class Gated(ModelCheckpoint):
        def _write(self, write, filepath):  # on the writer thread: fails once released
            released.append(release.wait(timeout=20))
            super()._write(write, filepath)

    begun, ended = [], []
    marker = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda e, logs: (begun.append(e), e == 3 and release.set()),
        on_epoch_end=lambda e, logs: ended.append(e),
    )
    callback = Gated(str(tmp_path / "{epoch}-{batch}.weights.h5"), save_weights_only=True,
                     save_freq=18, async_save=True)
    with pytest.raises(Exception) as err:
        fit(model, [callback, marker], epochs=6)  # 6 batches an epoch
    assert "saving " + str(tmp_path / "3-6.weights.h5") in "\n".join(err.value.__notes__)
    # The write of epoch index 2 was still running at that epoch's end (not waited for
    # there), failed during epoch 3, and was waited for and raised at epoch 3's end.
    assert released == [True]
    assert begun == [0, 1, 2, 3] and ended == [0, 1, 2]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # a real fit
def test_async_writes_one_at_a_time_and_train_end_waits(tmp_path):
    spans = []

    class Recorded(ModelCheckpoint):
        def _write(self, write, filepath):
            start = time.monotonic()
            super()._write(write, filepath)
            spans.append((threading.get_ident(), start, time.monotonic(), sorted(os.listdir(tmp_path))))

    model = get_model()
    fit(model, [Recorded(str(tmp_path / "{epoch}.keras"), async_save=True)], epochs=3)
    assert len(spans) == 3 and all(s[0] != threading.main_thread().ident for s in spans)
    for previous, following in zip(spans, spans[1:], strict=False):  # one write in flight at a time
        assert following[1] >= previous[2]
    assert [s[3] for s in spans] == [["1.keras"], ["1.keras", "2.keras"], ["1.keras", "2.keras", "3.keras"]]
    assert files(tmp_path) == ["1.keras", "2.keras", "3.keras"]  # waited for in on_train_end
    assert_same_arrays(keras.saving.load_model(tmp_path / "3.keras").get_weights(), model.get_weights())


@pytest.mark.slow  # a real fit
def test_a_consumer_flushing_first_gets_every_async_checkpoint(tmp_path):
    model = get_model()
    received, at_flush = [], []

    class Consumer(keras.callbacks.Callback):
        """Listed first, closes first (as a W&B run does at train end)."""

        def on_train_begin(self, logs=None):
            events.subscribe(self.model, "checkpoint_saved", received.append)

        def on_train_end(self, logs=None):
            events.publish(self.model, "flush", {"reason": "train_end"})
            at_flush.extend(p["epoch"] for p in received)

    checkpoint = ModelCheckpoint(str(tmp_path / "{epoch}.keras"), async_save=True)
    fit(model, [Consumer(), checkpoint], epochs=3)
    assert at_flush == [0, 1, 2]
    assert [p["epoch"] for p in received] == [0, 1, 2]  # published once each
    assert_same_arrays(keras.saving.load_model(tmp_path / "3.keras").get_weights(), model.get_weights())


@pytest.mark.slow  # a real fit
def test_no_temporary_files_are_left_behind(tmp_path):
    for async_save in (False, True):
        filepath = str(tmp_path / "{epoch}-{batch}-") + f"{async_save:d}.keras"
        fit(get_model(), [ModelCheckpoint(filepath, save_freq=1, async_save=async_save)], epochs=1)
    assert len(os.listdir(tmp_path)) == 12
    assert not [n for n in os.listdir(tmp_path) if atomic.is_temp_name(n) or n.startswith(".")]


def test_public_names():
    assert kmp.callbacks.ModelCheckpoint is ModelCheckpoint
    assert kmp.callbacks.ParallelModelCheckpoint is ParallelModelCheckpoint
    assert re.search(r"async_save", ModelCheckpoint.__doc__)
