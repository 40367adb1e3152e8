"""`strategy="model_parallel"` / `"hybrid"` on JAX refuse, before the first step, a model whose
parameters and optimizer slots exceed a device's memory (`backends.jax.memory`).

JAX's CPU devices report no memory (`memory_stats()` is `None`): there the check does
nothing, which the first test asserts on the real devices. The other tests replace the one
function that reads device memory, `memory.memory_stats`, with a figure per device (a GPU
cannot exist on this machine; the real `memory_stats` runs on the GPU machine). The bytes
the check counts are compared with bytes measured independently: each array's
`addressable_shards`, and the optimizer's real slots once built.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import keras
import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.backends.jax import memory
from keras_mgpu_plugins.errors import ModelTooLargeError
from tests.jax import helpers, memory_job
from tests.jax import model_parallel_job as job

pytestmark = [pytest.mark.timeout(300)]
DEVICES = helpers.simulated_devices(2)



def on_device(variables) -> dict[str, int]:
    """Bytes of `variables` per device, from their shards (independent of the module)."""
    found: dict[str, int] = {}
    for variable in variables:
        for shard in variable.value.addressable_shards:
            name = f"{shard.device.platform}:{shard.device.id}"
            found[name] = found.get(name, 0) + int(np.prod(shard.data.shape)) * shard.data.itemsize
    return found


def fake_memory(monkeypatch, limit: dict[str, int] | int, in_use: dict[str, int] | int = 0):
    def stats(device):
        name = f"{device.platform}:{device.id}"
        return {key: value[name] if isinstance(value, dict) else value
                for key, value in (("bytes_limit", limit), ("bytes_in_use", in_use))}

    monkeypatch.setattr(memory, "memory_stats", stats)


def adam_need() -> tuple[dict[str, int], dict[str, int]]:
    """The test model's parameter bytes per device, and parameters + 2 Adam slots."""
    keras.distribution.set_distribution(None)
    model = kmp.parallelize(job.build, strategy="model_parallel")(True)  # CPU: no check
    params = on_device(model.weights)
    trainable = on_device(model.trainable_weights)
    keras.distribution.set_distribution(None)
    return params, {d: params[d] + 2 * trainable[d] for d in params}


def test_cpu_devices_report_no_memory_so_nothing_is_checked():
    assert [memory.memory_stats(d) for d in jax.local_devices()] == [None, None]
    model = kmp.parallelize(job.build, strategy="model_parallel")(True)
    assert memory.check(model, "model_parallel") == []


@pytest.mark.parametrize("strategy", ["model_parallel", "hybrid"])
def test_a_model_too_large_even_sharded_is_refused_naming_the_bytes(monkeypatch, strategy):
    _, need = adam_need()
    fake_memory(monkeypatch, limit={d: n - 1 for d, n in need.items()})
    with pytest.raises(ModelTooLargeError) as raised:
        kmp.parallelize(job.build, strategy=strategy)(True)
    message = str(raised.value)
    assert f"strategy={strategy!r}" in message
    for device, n in need.items():
        assert f"{device} needs {n:,} bytes" in message, message
        assert f"has {n - 1:,} bytes available" in message, message
    assert "Adam, 2 slots per parameter, estimated" in message
    assert "largest variables there: hidden/kernel 6.0 KiB" in message  # (96, 16) float32
    assert [(d.device, d.needed_bytes, d.available_bytes) for d in raised.value.devices] == [
        (d, n, n - 1) for d, n in need.items()]


def test_a_variable_the_layout_map_leaves_replicated_is_named_in_the_error(monkeypatch):
    layout_map = keras.distribution.LayoutMap(None)
    layout_map["hidden/kernel"] = (None, "model")  # the embedding table: in no key
    _, need = adam_need()
    fake_memory(monkeypatch, limit={d: 1 for d in need})
    with pytest.raises(ModelTooLargeError) as raised:
        kmp.parallelize(job.build, strategy="model_parallel", layout_map=layout_map)(True)
    assert "table/embeddings (replicated (no layout_map key matches))" in str(raised.value)


def test_a_model_that_fits_trains_and_its_slots_were_estimated_exactly(monkeypatch):
    params, need = adam_need()
    fake_memory(monkeypatch, limit=need)  # exactly enough
    model = kmp.parallelize(job.build, strategy="model_parallel")(True)
    checked = memory.check(model, "model_parallel")
    assert {n.device: n.needed_bytes for n in checked} == need
    model.fit(*job.data(), batch_size=job.BATCH, epochs=1, verbose=0)
    scalars = on_device([v for v in model.optimizer.variables if not v.shape])
    slots = on_device([v for v in model.optimizer.variables if v.shape])
    assert {d: need[d] - params[d] for d in need} == slots  # the estimate was the real slots
    measured = memory.needs(model)  # the optimizer is built: its variables are measured
    assert {n.device: n.optimizer_bytes for n in measured} == {
        d: slots[d] + scalars.get(d, 0) for d in slots}
    assert {n.optimizer_how for n in measured} == {"measured"}


def test_bytes_in_use_by_other_arrays_are_not_available(monkeypatch):
    params, need = adam_need()
    other = 1000  # held on each device by something else than the model
    in_use = {d: params[d] + other for d in params}  # the model's parameters exist when checked
    fake_memory(monkeypatch, limit={d: n + other - 1 for d, n in need.items()}, in_use=in_use)
    with pytest.raises(ModelTooLargeError, match=f"less {other:,} in use by other arrays"):
        kmp.parallelize(job.build, strategy="model_parallel")(True)
    fake_memory(monkeypatch, limit={d: n + other for d, n in need.items()}, in_use=in_use)
    kmp.parallelize(job.build, strategy="model_parallel")(True)


class Custom(keras.optimizers.SGD):
    """An optimizer class kmp does not know (a subclass is not its parent)."""


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(), "sgd_momentum": lambda: keras.optimizers.SGD(momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(), "adam_amsgrad": lambda: keras.optimizers.Adam(amsgrad=True),
    "adamw": lambda: keras.optimizers.AdamW(), "nadam": lambda: keras.optimizers.Nadam(),
    "rmsprop": lambda: keras.optimizers.RMSprop(),
    "rmsprop_centered_momentum": lambda: keras.optimizers.RMSprop(centered=True, momentum=0.9),
    "adagrad": lambda: keras.optimizers.Adagrad(), "lion": lambda: keras.optimizers.Lion(),
    "ftrl": lambda: keras.optimizers.Ftrl(), "lamb": lambda: keras.optimizers.Lamb(),
    "adamax": lambda: keras.optimizers.Adamax(), "adadelta": lambda: keras.optimizers.Adadelta(),
    "sgd_ema": lambda: keras.optimizers.SGD(use_ema=True),
    "adam_accumulation": lambda: keras.optimizers.Adam(gradient_accumulation_steps=2),
    "loss_scale_adam": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_estimated_slots_equal_what_the_optimizer_builds(monkeypatch, name):
    """Each estimate, before the optimizer is built, against its real slots after."""
    fake_memory(monkeypatch, limit=2**40)

    def build():
        model = job.build()
        model.compile(OPTIMIZERS[name](), "mse")
        return model

    model = kmp.parallelize(build, strategy="model_parallel")()
    estimated = {n.device: n.optimizer_bytes for n in memory.check(model, "model_parallel")}
    model.optimizer.build(model.trainable_variables)  # under the distribution, as fit does
    slots = on_device([v for v in model.optimizer.variables if v.shape])
    assert estimated == {d: slots.get(d, 0) for d in estimated}


def test_an_unknown_optimizer_class_counts_the_parameters_alone(monkeypatch):
    params, _ = adam_need()
    fake_memory(monkeypatch, limit={d: n - 1 for d, n in params.items()})

    def build():
        model = job.build()
        model.compile(Custom(momentum=0.9), "mse")
        return model

    with pytest.raises(ModelTooLargeError) as raised:
        kmp.parallelize(build, strategy="model_parallel")()
    assert "Custom, an optimizer class kmp does not know: slots not counted" in str(raised.value)
    assert {d.device: d.needed_bytes for d in raised.value.devices} == params


@pytest.mark.slow
@pytest.mark.multi_worker
def test_hybrid_refuses_on_every_process_when_one_process_lacks_memory(tmp_path):
    """Process 0's devices are too small, process 1's are not: both raise, neither waits."""
    _, need = adam_need()
    enough = max(need.values())
    runs = kmp.launch(memory_job.hybrid_with_limits, num_workers=2, args=([enough - 1, enough],),
                      timeout=200, env=DEVICES)
    assert runs[0]["error"] == "ModelTooLargeError"
    assert f"needs {enough:,} bytes" in runs[0]["message"]
    assert runs[1]["error"] == "PeerFailedError"
    assert "worker 0: ModelTooLargeError" in runs[1]["message"]
    runs = kmp.launch(memory_job.hybrid_with_limits, num_workers=2, args=([enough, enough],),
                      timeout=200, env=DEVICES)
    assert runs == [{"error": None, "message": ""}] * 2


@pytest.mark.slow
def test_the_memory_benchmark_shows_unsharded_over_and_sharded_under_the_budget():
    """benchmarks/model_parallel_memory.py on JAX (no TensorFlow in this environment), tiny."""
    proc = subprocess.run(
        [sys.executable, str(helpers.ROOT / "benchmarks" / "model_parallel_memory.py"),
         "--backend", "jax", "--budget-mb", "8", "--steps", "1"],
        capture_output=True, text=True, timeout=280, env=helpers.environment())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    budget, need = result["budget_bytes"], result["need_bytes"]
    assert budget == 8 * 2**20 and need == pytest.approx(1.25 * budget, rel=0.02)
    one, parallel, sharded = (result["cases"][c] for c in ("one_device", "data_parallel", "sharded"))

    def held(case):
        return [case["parameters"][d] + case["optimizer"][d] for d in case["devices"]]

    scalars = 64  # Adam's iteration and learning rate
    assert need <= held(one)[0] <= need + scalars and held(one)[1] == 0
    assert all(need <= h <= need + scalars for h in held(parallel))  # replicated
    assert all(need / 2 <= h <= need / 2 + budget * 0.01 for h in held(sharded))  # + biases
    assert result["unsharded_over_budget"] and result["sharded_under_budget"]
    assert result["ratios"]["sharded / one device"] == pytest.approx(0.5, abs=0.01)
    assert all(v is None for c in (one, parallel, sharded) for v in c["peak"].values())
    assert "not reported by the platform" in proc.stdout
    for device, h in zip(sharded["devices"], held(sharded), strict=True):  # + a few scalars
        assert 0 <= sharded["live_after_step"][device] - h <= 1024
