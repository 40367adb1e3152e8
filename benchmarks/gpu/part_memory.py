"""`strategy="model_parallel"`'s memory check against the device's real `bytes_limit`, and the
GPU path of `benchmarks/model_parallel_memory_jax.py` (`peak_bytes_in_use`).

1. `benchmark`: `model_parallel_memory_jax.measure` on this machine's devices (its three
   cases in fresh processes: one device, data parallel, sharded), budget `budget_mb`; run
   first, before this process starts JAX and so reserves the GPU's memory.
2. `too_large`: a model whose parameters alone take `too_large_share` of the device's
   `bytes_limit` (read from `memory_stats()`; with Adam's 2 slots, 3x that is needed)
   raises `ModelTooLargeError` when the factory returns, before a step; its message and
   figures are kept, and its `bytes_limit` must be the device's.
3. `fits`: one whose parameters and Adam slots take `fits_share` of `bytes_limit` passes
   the check and trains 2 steps; the check's figures (`backends.jax.memory.needs`) and the
   memory statistics after the steps (`peak_bytes_in_use`) are kept.

Where the platform reports no memory (CPU) steps 2 and 3 build a small model and record
that the check does nothing. Kernels start at zero: this measures bytes, not arithmetic,
and zeros fill a 12 GB kernel without a random generator's temporaries.
"""

from __future__ import annotations

import gc

import common

SIZES = {
    # platform named, not "auto": the run checks the platform it measures (part_ceilings
    # records what kmp's planned_device_names says before JAX starts)
    "gpu": {"fits_share": 0.15, "too_large_share": 0.45, "depth": 4, "budget_mb": 512,
            "devices": 1, "platform": "gpu"},
    "cpu": {"fits_share": 0.15, "too_large_share": 0.45, "depth": 2, "budget_mb": 16,
            "devices": 1, "platform": "cpu", "cpu_width": 64},
}


def run(rec: common.Recorder, size: dict) -> None:
    with rec.step("benchmark"):  # first: its processes need the GPU's memory, not yet taken
        import model_parallel_memory_jax as bench

        rec.put(benchmark=bench.measure(size["budget_mb"], steps=2, devices=size["devices"],
                                         platform=size["platform"]))
    import jax

    stats = jax.devices()[0].memory_stats()
    limit = int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None
    rec.put(memory_stats_before=stats, bytes_limit=limit)
    with rec.step("too_large") as step:  # before `fits`: nothing else holds memory yet
        found = check_case(size, limit, size["too_large_share"], train=False)
        rec.put(too_large=found)
        if limit is not None and not found.get("raised"):
            step.update(status="failed", message=f"no ModelTooLargeError: {found}")
        elif limit is not None and found.get("limit_bytes") != limit:
            step.update(status="failed", message=f"the error's bytes_limit {found.get('limit_bytes')}"
                                                  f" is not the device's {limit}")
    with rec.step("fits"):
        rec.put(fits=check_case(size, limit, size["fits_share"] / 3, train=True))


def width_for(limit: int | None, share: float, depth: int, fallback: int) -> int:
    """The width of `depth` square float32 Dense kernels taking `share` of `limit` bytes."""
    if limit is None:
        return fallback
    return int((share * limit / 4 / depth) ** 0.5)


def check_case(size: dict, limit: int | None, share: float, train: bool) -> dict:
    """Builds a `model_parallel` MLP whose parameters take `share` of `limit`."""
    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.backends.jax import memory
    from keras_mgpu_plugins.errors import ModelTooLargeError

    width = width_for(limit, share, size["depth"], size.get("cpu_width", 64))

    @kmp.parallelize(strategy="model_parallel")
    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((width,))] + [
            keras.layers.Dense(width, use_bias=False, kernel_initializer="zeros")
            for _ in range(size["depth"])])
        model.compile(optimizer="adam", loss="mse")
        return model

    found: dict = {"width": width, "parameter_bytes": size["depth"] * width * width * 4}
    try:
        model = build()
    except ModelTooLargeError as err:
        need = err.devices[0] if err.devices else None
        found.update(raised=True, message=str(err)[:3000],
                     **({"needed_bytes": need.needed_bytes, "available_bytes": need.available_bytes,
                         "limit_bytes": need.limit_bytes, "other_bytes": need.other_bytes}
                        if need else {}))
        del err
        gc.collect()
        import jax

        found["memory_stats_after_error"] = jax.devices()[0].memory_stats()  # model freed?
        return found
    found.update(raised=False, needs=[vars(n) for n in memory.needs(model)])
    if train:
        x = np.random.default_rng(0).normal(size=(16, width)).astype("float32")
        model.fit(x, x, batch_size=8, epochs=1, verbose=0)
        import jax

        found["memory_stats_after_steps"] = jax.devices()[0].memory_stats()
    del model
    gc.collect()
    return found
