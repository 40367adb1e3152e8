"""WeightSyncVerifier between 2 real workers (kmp.launch, MultiWorkerMirroredStrategy).

One launch runs every scenario in order on both workers (each worker returns
what it saw), so the assertions compare the two workers' verdicts; a second
launch lets the error escape, as a user's script would.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.launch import WorkerFailedError

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]


def make_data(n=32):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 5)).astype("float32")
    return x, (x @ rng.normal(size=(5, 1))).astype("float32")


def build_model(batch_norm=False, compile=True):
    import keras  # unseeded initialisers: each worker draws its own

    layers = [keras.Input((5,)), keras.layers.Dense(6, activation="relu")]
    if batch_norm:
        layers += [keras.layers.BatchNormalization(), keras.layers.Dropout(0.2)]
    model = keras.Sequential([*layers, keras.layers.Dense(1)])
    if compile:
        model.compile(optimizer="adam", loss="mse")
    return model


def summary(verifier):
    return [
        (r.where, [(m.path, m.copies, m.max_abs_diff) for m in r.mismatches],
         [(u.path, u.copies) for u in r.unsynced])
        for r in verifier.reports
    ]


def nudge(model, variable, by):
    copy = model.distribute_strategy.experimental_local_results(variable.value)[0]
    copy.assign(copy.numpy() + by)


def scenarios(directory):
    import keras

    from keras_mgpu_plugins import collective
    from keras_mgpu_plugins.callbacks import events
    from keras_mgpu_plugins.callbacks.weight_sync_verifier import WeightSyncVerifier

    rank = collective.worker_index()
    x, y = make_data()
    logs: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logs.append(record.getMessage())
    logging.getLogger("keras_mgpu_plugins.callbacks.weight_sync_verifier").addHandler(handler)
    out = {"rank": rank}

    def fit(model, callbacks, epochs):
        return model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
                         callbacks=callbacks)

    # 1. BatchNormalization, Dropout, Adam, unseeded initialisers under the strategy
    model = kmp.parallelize(build_model)(batch_norm=True)
    verifier = WeightSyncVerifier(sync_stats=True)
    fit(model, [verifier], epochs=3)
    out["clean"] = {"replicas": model.distribute_strategy.num_replicas_in_sync,
                    "reports": summary(verifier), "weights": model.get_weights()}

    # 2. built outside any strategy: each worker would train its own model (refused first)
    plain = build_model()
    start = len(logs)
    try:
        fit(plain, [WeightSyncVerifier()], epochs=1)
        out["outside"] = None
    except kmp.errors.SeparateModelsError as err:
        out["outside"] = (str(err), int(plain.optimizer.iterations.numpy()))
    out["outside_logs"] = logs[start:]

    # 3. worker 1's copy nudged after epoch 2: both workers raise at that check
    model = kmp.parallelize(build_model)()
    kernel = model.layers[0].kernel

    class Planter(keras.callbacks.Callback):
        epochs_done = 0

        def on_epoch_end(self, epoch, logs=None):
            Planter.epochs_done = epoch + 1
            if epoch == 1 and rank == 1:
                nudge(model, kernel, 1e-3)

    try:
        fit(model, [Planter(), WeightSyncVerifier()], epochs=4)
        out["raised"] = None
    except kmp.WeightsOutOfSyncError as err:
        out["raised"] = {"message": str(err), "epochs_done": Planter.epochs_done, "path": kernel.path,
                         "mismatches": [(m.path, m.copies, m.max_abs_diff) for m in err.mismatches]}

    # 4. worker 1 loads other weights: resync copies the chief's, training goes on
    model = kmp.parallelize(build_model)()
    chief_start = [w.copy() for w in model.get_weights()]
    if rank == 1:
        model.set_weights([w + 0.01 for w in model.get_weights()])
    verifier = WeightSyncVerifier(on_mismatch="resync")
    start = len(logs)
    history = fit(model, [verifier], epochs=2)
    out["resync"] = {"reports": summary(verifier), "weights": model.get_weights(),
                     "chief_start": chief_start, "epochs": len(history.history["loss"]),
                     "logs": logs[start:]}

    # 5. warn: logs on the chief, goes on
    model = kmp.parallelize(build_model)()
    bias = model.layers[-1].bias
    if rank == 1:
        nudge(model, bias, 0.5)
    verifier = WeightSyncVerifier(on_mismatch="warn")
    start = len(logs)
    history = fit(model, [verifier], epochs=2)
    out["warn"] = {"reports": summary(verifier), "epochs": len(history.history["loss"]), "path": bias.path,
                   "logs": logs[start:]}

    # 6. ModelCheckpoint listed BEFORE WeightSyncVerifier(sync_stats=True): every worker
    # averages the statistics at the checkpoint's "before_save" event, then the chief saves
    model = kmp.parallelize(build_model)(batch_norm=True)
    bn = model.layers[1]

    def local_statistics():
        return [[c.numpy() for c in model.distribute_strategy.experimental_local_results(v.value)]
                for v in (bn.moving_mean, bn.moving_variance)]

    seen = []  # subscribed before the verifier: this worker's copies before averaging
    events.subscribe(model, "before_save", lambda payload: seen.append((payload, local_statistics())))
    verifier = WeightSyncVerifier(sync_stats=True)
    checkpoint = kmp.callbacks.ModelCheckpoint(os.path.join(directory, "{epoch}.weights.h5"),
                                               save_weights_only=True)
    fit(model, [checkpoint, verifier], epochs=2)
    out["checkpoint"] = {"seen": seen, "after": local_statistics(), "reports": summary(verifier)}

    # 7. arguments that differ between workers: both raise before the first check
    try:
        fit(kmp.parallelize(build_model)(), [WeightSyncVerifier(check_freq=("epoch", 2)[rank])], epochs=1)
        out["differing"] = None
    except collective.SettingsDifferError as err:
        out["differing"] = str(err)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def results(checkpoints):
    return kmp.launch(scenarios, num_workers=2, args=(str(checkpoints),), timeout=220)


def test_no_false_alarm_with_batch_norm_dropout_adam(results):
    first, second = (r["clean"] for r in results)
    assert first["replicas"] == 2
    assert first["reports"] == second["reports"]
    assert [r[0] for r in first["reports"]] == [
        "train begin", "end of epoch 1", "end of epoch 2", "end of epoch 3", "train end"]
    assert all(mismatches == [] for _, mismatches, _ in first["reports"])
    # unseeded initialisers still agree: TensorFlow broadcasts the chief's initial values
    assert first["reports"][0] == ("train begin", [], [])
    # the statistics drift apart between workers, are reported, and averaged (sync_stats)
    unsynced = first["reports"][1][2]
    assert sorted(p.rsplit("/", 1)[1] for p, _ in unsynced) == ["moving_mean", "moving_variance"]
    assert all(copies == ((1, 0),) for _, copies in unsynced)
    for a, b in zip(first["weights"], second["weights"], strict=True):
        assert np.array_equal(a, b)


def test_a_model_outside_the_job_strategy_is_refused_before_training(results):
    """Each worker would train (and the verifier compare) a model of its own: refused on
    every worker before the first step (`runtime.apart`), the verifier never running."""
    for rank, result in enumerate(results):
        message, steps = result["outside"]
        assert message.startswith(f"This process is rank {rank} of 2 processes on the "
                                  "TensorFlow lane"), message
        assert "MultiWorkerMirroredStrategy" in message and steps == 0
        assert result["outside_logs"] == []


def test_both_workers_raise_at_the_same_epoch(results):
    first, second = (r["raised"] for r in results)
    assert first is not None and second is not None
    assert first == second  # same check, same message, same records
    assert first["epochs_done"] == 2 and "at end of epoch 2:" in first["message"]
    ((path, copies, diff),) = first["mismatches"]
    assert path == first["path"] and copies == ((1, 0),)
    assert diff == pytest.approx(1e-3, rel=1e-3)


def test_resync_copies_the_chiefs_weights_to_every_worker(results):
    first, second = (r["resync"] for r in results)
    assert first["epochs"] == second["epochs"] == 2
    begin = first["reports"][0]
    assert begin[0] == "train begin" and len(begin[1]) == 4  # 2 kernels, 2 biases
    assert all(copies == ((1, 0),) and diff == pytest.approx(0.01, rel=1e-3)
               for _, copies, diff in begin[1])
    assert all(mismatches == [] for _, mismatches, _ in first["reports"][1:])
    for a, b in zip(first["weights"], second["weights"], strict=True):
        assert np.array_equal(a, b)
    assert any("Resynchronised" in line for line in first["logs"])
    assert second["logs"] == []  # side effects on the chief only


def test_warn_logs_on_the_chief_and_goes_on(results):
    first, second = (r["warn"] for r in results)
    assert first["epochs"] == second["epochs"] == 2
    assert first["reports"] == second["reports"]
    assert [len(m) for _, m, _ in first["reports"]] == [1, 1, 1]
    assert len(first["logs"]) == 3 and all(first["path"] in line for line in first["logs"])
    assert second["logs"] == []


def test_checkpoint_listed_first_saves_the_average_over_both_workers(results, checkpoints):
    first, second = (r["checkpoint"] for r in results)
    points = [[(p["epoch"], p["batch"]) for p, _ in w["seen"]] for w in (first, second)]
    assert points[0] == points[1] == [(0, None), (1, None)]  # every worker, same points
    assert len({p["fit"] for p, _ in first["seen"]}) == 1  # one fit
    assert sorted(os.listdir(checkpoints)) == ["1.weights.h5", "2.weights.h5"]
    plain = build_model(batch_norm=True, compile=False)
    for epoch in (0, 1):
        plain.load_weights(str(checkpoints / f"{epoch + 1}.weights.h5"))
        bn = plain.layers[1]
        saved = [bn.moving_mean.numpy(), bn.moving_variance.numpy()]
        for i, in_file in enumerate(saved):
            (a,), (b,) = first["seen"][epoch][1][i], second["seen"][epoch][1][i]  # one replica each
            assert not np.array_equal(a, b)  # the workers' statistics had drifted apart
            average = ((a.astype(np.float64) + b.astype(np.float64)) / 2).astype(a.dtype)
            np.testing.assert_array_equal(in_file, average)  # to the bit
    for worker in (first, second):  # and every worker holds what was saved last
        for (copy,), in_file in zip(worker["after"], saved, strict=True):
            np.testing.assert_array_equal(copy, in_file)
    assert first["reports"] == second["reports"]
    assert [r[0] for r in first["reports"]] == [
        "train begin", "before save, end of epoch 1", "end of epoch 1",
        "before save, end of epoch 2", "end of epoch 2", "train end"]
    assert [len(r[2]) for r in first["reports"]] == [0, 2, 0, 2, 0, 0]


def test_differing_arguments_raise_on_both_workers_at_train_begin(results):
    for rank, r in enumerate(results):
        assert r["differing"].endswith(
            f"Differing: check_freq (here {('epoch', 2)[rank]!r}; differs from the chief's on worker(s) 1).")
        assert r["differing"].startswith("WeightSyncVerifier must be created with the same arguments")


def raise_through():
    from keras_mgpu_plugins import collective
    from keras_mgpu_plugins.callbacks.weight_sync_verifier import WeightSyncVerifier

    model = kmp.parallelize(build_model)()
    if collective.worker_index() == 1:
        nudge(model, model.layers[0].kernel, 1e-3)
    x, y = make_data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[WeightSyncVerifier()])


def test_the_error_reaches_the_launcher_with_the_remote_traceback():
    with pytest.raises(WorkerFailedError) as info:
        kmp.launch(raise_through, num_workers=2, timeout=200)
    text = info.value.remote_traceback
    assert "WeightsOutOfSyncError" in text and "at train begin" in text
    assert "dense/kernel [model]: worker 1 replica 0" in text
