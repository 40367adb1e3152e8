"""The fit settings that matter for big models under `strategy="model_parallel"` (2 simulated
devices, this process) and `"hybrid"` (2 processes of 2 devices, one `kmp.launch` job for
every setting), each against plain Keras on one device (`model_parallel_settings.py`).

float32 settings (gradient accumulation, `steps_per_execution` 2 and 3 with 4 steps an
epoch, `jit_compile=False`): weights, History, evaluate and predict within 1e-5, History
keys equal (and identical on both processes). `mixed_bfloat16`: within `NOISE_FACTOR`
times bfloat16's noise, measured here on one device as the larger difference of two
equivalent computations in another order (`jit_compile=False`; each batch's rows
reversed) from the reference (History and evaluate: one noise, the larger of the two,
as they log the same loss and metric). `jit_compile=False` on several processes of several CPU
devices hangs in JAX: refused before training. `micro_batches` is refused naming what to
use, and what it names trains as one device.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.jax import helpers
from tests.jax import model_parallel_job as job
from tests.jax import model_parallel_settings as settings

pytestmark = [pytest.mark.timeout(300)]
TOLERANCE = 1e-5
#: bfloat16: the model-parallel difference may be this many times the one-device noise
#: (measured: at most 2.0x, Adam's weights; see docs/model_parallelism.md).
NOISE_FACTOR = 4
FLOAT32 = [name for name in settings.SETTINGS if name not in settings.MIXED]
DEVICES = helpers.simulated_devices(2)
EAGER = ["sgd_no_jit", "adam_no_jit_steps_per_execution_3"]



_ONE_DEVICE: dict = {}


def one_device(name: str, variant: str = "reference") -> dict:
    """Plain Keras on one device, once per setting and variant: "reference", or the noise
    variants "eager" (`jit_compile=False`) and "reversed" (each batch's rows reversed)."""
    if (name, variant) not in _ONE_DEVICE:
        keras.distribution.set_distribution(None)
        model = settings.factory(name, jit_compile=False if variant == "eager" else None)()
        with keras.device("cpu:0"):
            _ONE_DEVICE[(name, variant)] = settings.train(model, reverse=variant == "reversed")
    return _ONE_DEVICE[(name, variant)]


def noise(name: str) -> dict:
    """bfloat16's noise for setting `name`: per quantity, the larger difference of the two
    equivalent one-device computations from the reference. History and evaluate hold the
    same values (loss, mae): one noise for both, the larger."""
    reference = one_device(name)
    eager, reverse = (settings.worst(one_device(name, v), reference)
                      for v in ("eager", "reversed"))
    measured = {key: max(eager[key], reverse[key]) for key in eager}
    measured["history"] = measured["evaluate"] = max(measured["history"], measured["evaluate"])
    return measured


def assert_float32_as_one_device(results: dict, name: str) -> None:
    expected = one_device(name)
    assert json.loads(results["history"]).keys() == json.loads(expected["history"]).keys()
    worst = settings.worst(results, expected)
    assert all(value <= TOLERANCE for value in worst.values()), (name, worst)


def assert_mixed_within_noise(results: dict, name: str) -> None:
    measured = noise(name)
    assert all(0 < value < 1e-2 for value in measured.values()), (name, measured)  # bf16 rounds
    worst = settings.worst(results, one_device(name))
    for key, value in worst.items():
        assert value <= NOISE_FACTOR * measured[key], (name, key, value, measured)


def assert_sharded(facts: dict, name: str, mesh: dict) -> None:
    assert facts["mesh"] == mesh, name
    assert facts["shards"] == [(96, 16), (96, 16)], name  # output columns over "model"
    assert facts["slot_shards"] == ([(96, 16)] if facts["slots"] else []), name  # slots follow
    # Adam: m and v; gradient accumulation: its accumulator, sharded as the parameter.
    optimizer, options = settings.SETTINGS[name]
    assert facts["slots"] == 2 * (optimizer == "adam") + bool(options.get("accumulate")), name
    mixed = "mixed" in name
    assert facts["dtypes"] == ("float32", "bfloat16" if mixed else "float32"), name


@pytest.mark.parametrize("name", FLOAT32)
def test_model_parallel_float32_setting_trains_as_one_device(name):
    model = kmp.parallelize(settings.factory(name), strategy="model_parallel")()
    results = settings.train(model)
    assert_float32_as_one_device(results, name)
    assert_sharded(settings.facts(model), name, {"batch": 1, "model": 2})


@pytest.mark.parametrize("name", settings.MIXED)
def test_model_parallel_mixed_bfloat16_is_within_its_noise(name):
    model = kmp.parallelize(settings.factory(name), strategy="model_parallel")()
    results = settings.train(model)
    assert_mixed_within_noise(results, name)
    assert_sharded(settings.facts(model), name, {"batch": 1, "model": 2})


@pytest.mark.parametrize("strategy", ["model_parallel", "hybrid", "auto"])
def test_micro_batches_is_refused_naming_gradient_accumulation(strategy):
    with pytest.raises(ValueError) as raised:
        kmp.parallelize(job.build, strategy=strategy, micro_batches=2)
    words = ["micro_batches=2", f"strategy={strategy!r}", "JAX", "batch_size=B // k",
             "gradient_accumulation_steps=k"]
    assert all(word in str(raised.value) for word in words), str(raised.value)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_gradient_accumulation_over_smaller_batches_trains_as_the_whole_batch(optimizer):
    """What the micro_batches refusal names: model_parallel, batch_size 4 and
    gradient_accumulation_steps=2, against one device at batch_size 8 with no accumulation."""
    def fit(model, batch):
        x, y = job.data()
        history = model.fit(x, y, batch_size=batch, epochs=job.EPOCHS, shuffle=False,
                            verbose=0, validation_data=(x[:16], y[:16]))
        return {"history": json.dumps(history.history), "weights": job.weights(model),
                "evaluate": np.asarray(model.evaluate(x, y, batch_size=8, verbose=0)),
                "predict": model.predict(x, batch_size=8, verbose=0)}

    with keras.device("cpu:0"):
        whole = fit(settings.build(optimizer), 8)
    model = kmp.parallelize(lambda: settings.build(optimizer, accumulate=2),
                            strategy="model_parallel")()
    worst = settings.worst(fit(model, 4), whole)
    assert all(value <= TOLERANCE for value in worst.values()), worst


@pytest.mark.slow
@pytest.mark.multi_worker
def test_hybrid_two_processes_of_two_devices_hold_every_setting():
    cases = [(name, "hybrid") for name in settings.SETTINGS] + [("sgd_no_jit", "auto")]
    runs = kmp.launch(settings.hybrid_job, num_workers=2, args=(cases,), timeout=280,
                      env=DEVICES)
    for run in runs:
        assert run["processes"] == 2 and run["local_devices"] == 2
    for name, strategy in cases:
        key = f"{strategy}:{name}"
        first, second = (run[key] for run in runs)
        if name in EAGER:  # refused on every process, before training, naming the setting
            for run in (first, second):
                assert run.keys() == {"error"}, (key, run.keys())
                assert run["error"].startswith("ValueError: fit: jit_compile=False"), run
                assert "2 JAX processes of 2 CPU devices each" in run["error"], run
            continue
        assert "error" not in first and "error" not in second, (key, first.get("error"))
        assert first["history"] == second["history"], key  # identical logs on both processes
        np.testing.assert_array_equal(first["predict"], second["predict"])
        for run in (first, second):
            assert_sharded(run, name, {"batch": 2, "model": 2})
            if name in settings.MIXED:
                assert_mixed_within_noise(run, name)
            else:
                assert_float32_as_one_device(run, name)
