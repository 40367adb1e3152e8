"""kmp-verify's decisions on plain records, without training: the table and the parting
step (`_compare`), the reasons a comparison is refused (`_checks`), the likely causes
(`_causes`), the report's text and exit codes, and the command's usage errors. Backend-free:
these run in every lane's CI job."""

from __future__ import annotations

import copy
import json
import types

import numpy as np
import pytest

from keras_mgpu_plugins.verify import _causes, _checks, _cli, _compare, _config, _fingerprint
from keras_mgpu_plugins.verify._report import CANNOT, DIFFER, EQUAL, VerifyReport


def record(steps: int = 4, shift: float = 0.0, at: int = 99, noise: float = 0.0) -> dict:
    """A run's record: a loss falling by 0.1 per step, two variables; from step `at` on
    `shift` is added to the loss and to `dense/kernel`; `noise` to every figure."""
    out = {"data": "d1", "settings": {"others": "o", "batch_size": 16},
           "initial": {"dense/kernel": [0.5]}, "notes": [], "steps": [], "epochs": [],
           "evaluate": {"loss": 1.0 + noise + shift * (at <= steps)},
           "predict": [np.full(3, 2.0 + noise)], "facts": None}
    for step in range(1, steps + 1):
        moved = shift if step >= at else 0.0
        out["steps"].append({"step": step,
                             "logs": {"loss": 1.0 - 0.1 * step + moved + noise},
                             "variables": {"dense/kernel": np.array([0.5 + moved + noise]),
                                           "norm/gamma": np.array([1.0 + noise])}})
    out["final"] = dict(out["steps"][-1]["variables"])
    out["epochs"] = [{"epoch": 0, "step": steps, "logs": {"val_loss": 0.7 + noise}}]
    return out


def test_equal_runs_are_within_their_noise():
    found = _compare.compare(record(), record(noise=1e-7), record(noise=2e-7), None)
    assert found.equal and found.first_step is None
    loss = next(r for r in found.rows if r.figure == "loss")
    assert loss.noise == pytest.approx(2e-7) and loss.tolerance == pytest.approx(2e-6)


def test_the_parting_step_and_the_variables_that_differ_most():
    found = _compare.compare(record(), record(shift=0.01, at=3), record(noise=1e-7), None)
    assert not found.equal
    assert found.first_step == 3 and found.parted_keys == ["loss"]
    assert found.top_variables[0][0] == "dense/kernel"
    assert found.top_variables[0][1] == pytest.approx(0.01)


def test_a_difference_below_ten_times_the_noise_passes_and_above_fails():
    reference, noise = record(), record(noise=1e-5)
    assert _compare.compare(reference, record(noise=9e-5), noise, None).equal
    assert not _compare.compare(reference, record(noise=2e-4), noise, None).equal


def test_a_given_tolerance_replaces_the_noise():
    found = _compare.compare(record(), record(noise=1e-3), None, 1e-2)
    assert found.equal and all(r.noise is None for r in found.rows if r.figure == "loss")
    assert not _compare.compare(record(), record(noise=1e-3), None, 1e-4).equal


def test_fewer_steps_in_the_parallel_run_is_a_difference():
    found = _compare.compare(record(steps=4), record(steps=3), None, 1.0)
    assert not found.equal
    assert next(r for r in found.rows if r.figure == "training steps recorded").difference == 1


def run_record(*fits: dict) -> dict:
    """A process's record holding `fits` (each a `record()`)."""
    return {"fit_calls": len(fits), "undecorated": [], "unseedable": [], "clock": [],
            "fits": list(fits)}


def runs(**records: dict | None) -> dict:
    return {name: types.SimpleNamespace(chief=None if rec is None else run_record(rec),
                                        failure=None, log_dir="/logs")
            for name, rec in records.items()}


def test_comparable_runs_have_no_reason():
    assert _checks.reasons(runs(reference=record(), parallel=record(noise=1e-7))) == []


@pytest.mark.parametrize(("change", "words"), [
    (lambda r: r.update(fit_calls=0, fits=[]), "never called fit"),
    (lambda r: r.update(undecorated=["Sequential 'seq'"]), "did not build"),
    (lambda r: r["fits"][0].update(data="d2"), "other data"),
    (lambda r: r["fits"][0]["settings"].update(batch_size=32),
     "batch_size (16 on one device, 32 here)"),
    (lambda r: r["fits"][0].update(initial={"dense/kernel": [0.6]}), "starts from other weights"),
    (lambda r: r.update(unseedable=["random.Random() without a seed at t.py:3"]),
     "random.Random() without a seed at t.py:3"),
    (lambda r: r["fits"].append(record()), "calls fit 2 time(s)"),
])
def test_each_reason_the_runs_cannot_be_compared_is_named(change, words):
    found = runs(reference=record(), parallel=record())
    change(found["parallel"].chief)
    reasons = _checks.reasons(found)
    assert len(reasons) == 1 and words in reasons[0], reasons


def test_the_clock_is_named_where_the_data_differ():
    found = runs(reference=record(), parallel=record())
    found["parallel"].chief["fits"][0]["data"] = "d2"
    found["parallel"].chief["clock"] = ["the clock (time.time()) at t.py:9"]
    (reason,) = _checks.reasons(found)
    assert "other data" in reason and "time.time()) at t.py:9" in reason


def test_a_failed_run_is_named_with_its_error():
    found = runs(reference=record(), parallel=None)
    found["parallel"].failure = "Worker 0 of 2 raised ValueError\nValueError: bad"
    (reason,) = _checks.reasons(found)
    assert reason.startswith("the parallel run failed") and "ValueError: bad" in reason


def facts(**changes) -> dict:
    base = {"batchnorm": [], "train_step": None, "losses": [], "embeddings": [],
            "metrics": [{"name": "loss", "module": "keras.src", "class": "Mean"}],
            "random_layers": [], "random_layers_as_one_device": False,
            "steps_per_execution": 1, "loss_scale": False, "dtype_policy": "float32",
            "replicas": 2}
    return {**base, **changes}


def parted(keys: list[str], what: str | None = None, top=()) -> _compare.Comparison:
    return _compare.Comparison(rows=[], first_step=1, parted_keys=keys,
                               first_what=what or ", ".join(keys), top_variables=list(top))


@pytest.mark.parametrize(("model", "cause"), [
    (facts(batchnorm=[{"layer": "norm", "synchronized": False}]), "batchnorm"),
    (facts(train_step="train.Custom.train_step"), "train_step"),
    (facts(losses=[{"name": "mse", "module": "keras.src",
                    "reduction": "mean_with_sample_weight"}]), "loss"),
    (facts(losses=[{"name": "mine", "module": "train", "reduction": None}]), "loss"),
    (facts(embeddings=["table"]), "embedding"),
    (facts(random_layers=[{"layer": "drop", "class": "Dropout", "draws": True}]),
     "random_layers"),
    (facts(loss_scale=True, dtype_policy="mixed_float16"), "loss_scale"),
    (facts(steps_per_execution=4), "steps_per_execution"),
])
def test_each_cause_present_is_named(model, cause):
    found = _causes.likely(model, parted(["loss"], "loss, variables"), "tensorflow")
    assert [key for key, _ in found] == [cause]


def test_a_metric_alone_differing_names_the_unreduced_metric_first():
    model = facts(batchnorm=[{"layer": "norm", "synchronized": False}])
    found = _causes.likely(model, parted(["largest_error"]), "tensorflow")
    assert [key for key, _ in found] == ["metric"] and "largest_error" in found[0][1]


def test_a_metric_of_keras_differing_alone_still_names_the_causes_present():
    model = facts(loss_scale=True, dtype_policy="mixed_float16",
                  metrics=[{"name": "loss", "module": "keras.src", "class": "Mean"},
                           {"name": "mae", "module": "keras.src", "class": "MeanMetricWrapper"}])
    found = _causes.likely(model, parted(["mae"]), "jax")
    assert [key for key, _ in found] == ["loss_scale"]


def test_a_synchronized_batchnorm_or_random_layers_drawing_as_one_device_are_no_cause():
    model = facts(batchnorm=[{"layer": "norm", "synchronized": True}],
                  random_layers=[{"layer": "drop", "class": "Dropout", "draws": True}],
                  random_layers_as_one_device=True)
    assert _causes.likely(model, parted(["loss"]), "tensorflow") == []


def test_the_cause_whose_layers_differ_most_comes_first():
    model = facts(embeddings=["table"], loss_scale=True)
    untouched = _causes.likely(model, parted(["loss"], top=[("model/dense/kernel", 1.0)]),
                               "tensorflow")
    touched = _causes.likely(model, parted(["loss"], top=[("model/table/embeddings", 1.0)]),
                             "tensorflow")
    assert [key for key, _ in untouched] == ["loss_scale", "embedding"]
    assert [key for key, _ in touched] == ["embedding", "loss_scale"]
    custom = facts(embeddings=["table"], train_step="t.C.train_step")
    found = _causes.likely(custom, parted(["loss"], "loss, variables",
                                          top=[("table/embeddings", 1.0)]), "tensorflow")
    assert [key for key, _ in found] == ["embedding", "train_step"]


def test_the_report_text_json_and_exit_codes(tmp_path):
    rows = [{"figure": "loss", "count": 4, "difference": 0.5, "noise": 1e-7,
             "tolerance": 1e-6, "within": False}]
    report = VerifyReport(DIFFER, rows=rows, first_step=2, first_what="loss",
                          top_variables=[("dense/kernel", 0.3)],
                          causes=[("batchnorm", "BatchNormalization without sync_batchnorm")],
                          backend="tensorflow", steps=4)
    text = str(report)
    assert "DIFFER" in text and "part at step 2" in text and "dense/kernel (0.3)" in text
    assert "Likely cause: BatchNormalization without sync_batchnorm." in text
    report.to_json(str(tmp_path / "r.json"))
    assert json.loads((tmp_path / "r.json").read_text())["first_step"] == 2
    assert (report.exit_code, VerifyReport(EQUAL).exit_code, VerifyReport(CANNOT).exit_code) \
        == (1, 0, 1)
    assert not report.ok and VerifyReport(EQUAL).ok


def test_the_config_travels_in_the_environment(monkeypatch):
    config = _config.Config(folder="/f", run="parallel", devices=2, steps=8)
    monkeypatch.setenv(_config.ENV, config.to_env())
    assert _config.current() == config and _config.devices_for(4) == 2
    assert _config.launches_in_place()
    monkeypatch.delenv(_config.ENV)
    assert _config.current() is None and _config.devices_for(4) == 4


def test_fingerprints_tell_arrays_apart_and_pass_a_generator_on():
    x = np.arange(12.0).reshape(6, 2)
    assert _fingerprint.of_arrays({"a": x}) == _fingerprint.of_arrays({"a": x.copy()})
    assert _fingerprint.of_arrays(x) != _fingerprint.of_arrays(x[::-1])
    tee = _fingerprint.Tee(iter([x, x + 1]))
    assert [float(b.sum()) for b in tee.generator()] == [66.0, 78.0]
    assert tee.value() != _fingerprint.Tee(iter([x])).value()


@pytest.mark.parametrize(("argv", "words"), [
    (["-n", "1", "t.py"], "-n must be an integer of at least 2"),
    (["--steps", "0", "t.py"], "--steps must be a positive integer"),
    (["-n", "2", "no_such_script.py"], "can't open file"),
])
def test_usage_errors_exit_2_naming_the_option(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    assert _cli.main(argv) == 2
    assert words in capsys.readouterr().err


def test_the_script_arguments_are_the_scripts():
    assert _cli._split(["-n", "2", "--steps", "4", "t.py", "--steps", "9"]) == (
        ["-n", "2", "--steps", "4", "t.py"], ["--steps", "9"])


def test_copy_of_a_record_is_independent():  # the fixtures above are not shared state
    a = record()
    b = copy.deepcopy(a)
    b["steps"][0]["logs"]["loss"] = 0.0
    assert a["steps"][0]["logs"]["loss"] != 0.0
