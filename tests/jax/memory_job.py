"""What each process of the 2-process memory-check test runs (`kmp.launch`, 2 processes of 2
CPU devices each, `strategy="hybrid"`): every device reports `limit` bytes of memory
(`backends.jax.memory.memory_stats` replaced: CPU devices report none), a limit that differs
between the processes."""

from __future__ import annotations


def hybrid_with_limits(limits: list[int]) -> dict:
    import jax

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.backends.jax import memory
    from tests.jax import model_parallel_job as job

    limit = limits[jax.process_index()]
    memory.memory_stats = lambda device: {"bytes_limit": limit, "bytes_in_use": 0}
    try:
        kmp.parallelize(job.build, strategy="hybrid")(True)
    except Exception as err:  # noqa: BLE001 - what each process raised, for the test
        return {"error": type(err).__name__, "message": str(err)}
    return {"error": None, "message": ""}
