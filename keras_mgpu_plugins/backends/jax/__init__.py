"""The JAX backend: `keras.distribution` (DataParallel over every device of every process)
over `jax.distributed` processes, their collectives, simulated CPU devices, and inputs fed
to each process as one device would see them.

The functions below are what the backend-free package asks of a backend
(`keras_mgpu_plugins.backends.current()`); each imports JAX only when called.
"""

from __future__ import annotations

from typing import Any


def runtime_of(model: Any = None) -> Any:
    """The runtime of this JAX process (`jax.process_index()` of `jax.process_count()`)."""
    from keras_mgpu_plugins.backends.jax.runtime import JaxRuntime

    return JaxRuntime.for_model(model)


def saving_in_a_job() -> str:
    """What saving the model takes in a job of several processes on this lane (messages)."""
    return ("reading a model's variables laid out over every process's devices (a "
            "keras.distribution over jax.distributed) to save them needs every process")


def apart(model: Any) -> str | None:
    """Why `model` would train apart from the job's other processes, or `None` (`runtime.apart`)."""
    from keras_mgpu_plugins.backends.jax.runtime import apart as why

    return why(model)


def simulate_devices(n: int, memory_limit_mb: int | None = None) -> list[str]:
    """`n` CPU devices, set before JAX's backend starts."""
    from keras_mgpu_plugins.backends.jax.devices import simulate_devices as split

    return split(n, memory_limit_mb)


def local_device_names() -> tuple[str, ...]:
    """This process's JAX devices, e.g. `("GPU:0", "GPU:1")` or `("CPU:0", "CPU:1")`.

    Before JAX's backend starts they are named from its configuration, without
    starting it (listing them would: `simulate_devices` and `jax.distributed`
    must come before), as `kmp.topology()` does before a backend is imported.
    """
    import jax

    from keras_mgpu_plugins.compat._private import jax_backends_started

    if not jax_backends_started():
        from keras_mgpu_plugins.backends.jax.devices import planned_device_names

        return planned_device_names()
    return tuple(f"{d.platform.upper()}:{i}" for i, d in enumerate(jax.local_devices()))


def gpu_memory() -> Any:
    """This process's JAX GPUs and `Device.memory_stats()` (`samplers.gpu.GPUMemory`).

    JAX has no call that restarts a device's peak: `reset_peak` does nothing, and
    the peak is the process's so far.
    """
    from types import SimpleNamespace

    import jax

    from keras_mgpu_plugins.samplers.gpu import GPUDevice

    gpus = [d for d in jax.local_devices() if d.platform.upper() == "GPU"]
    devices = [GPUDevice(name=f"GPU:{i}", ordinal=int(d.local_hardware_id), physical=str(d),
                         framework="JAX", model=getattr(d, "device_kind", None))
               for i, d in enumerate(gpus)]

    def read(name: str) -> dict[str, int] | None:
        index = [g.name for g in devices].index(name) if name in [g.name for g in devices] else -1
        stats = gpus[index].memory_stats() if index >= 0 else None
        if not stats:
            return None
        return {"current": int(stats.get("bytes_in_use", 0)),
                "peak": int(stats.get("peak_bytes_in_use", 0))}

    return SimpleNamespace(devices=devices, read=read, reset_peak=lambda name: None)


def remote_files() -> Any:
    """Remote paths need TensorFlow's file systems, which the JAX lane does not load."""
    from keras_mgpu_plugins.backends import single

    return single.remote_files()


def summary_writer(logdir: str) -> Any:
    """TensorBoard event files need TensorFlow's writer, which the JAX lane does not load."""
    from keras_mgpu_plugins.backends import single

    return single.summary_writer(logdir)


def parallelize_factory(factory: Any, *, strategy: Any, devices: Any, require_compiled: bool,
                        micro_batches: Any, sync_batchnorm: bool, layout_map: Any = None,
                        partition: Any = None) -> Any:
    """`kmp.parallelize` with `keras.distribution` (see `backends/jax/distribution.py`)."""
    from keras_mgpu_plugins.backends.jax.distribution import parallelize_jax, refuse_partition

    refuse_partition(strategy, partition)

    return parallelize_jax(factory, strategy, devices, require_compiled, micro_batches,
                           sync_batchnorm, layout_map)


def join_job() -> None:
    """Joins the multi-process job before any user code: `jax.distributed` from the
    environment (the launcher's, SLURM's or `KERAS_DISTRIBUTION_*`), before any JAX call."""
    from keras_mgpu_plugins.backends.jax.distribution import initialize

    initialize()


def serve_parameter_server(topology: Any) -> None:
    """Parameter servers are TensorFlow's: refused on JAX (keras-team/keras#20753)."""
    from keras_mgpu_plugins.backends.jax.distribution import PARAMETER_SERVER_REFUSAL

    raise RuntimeError('TF_CONFIG describes a parameter-server cluster (task type "ps"). '
                       + PARAMETER_SERVER_REFUSAL)


def read_variable(variable: Any) -> Any:
    """`variable`'s value of this moment, kept while training goes on.

    A copy on the variable's devices: Keras's JAX trainer donates the arrays it
    trains to the next step, which deletes them. A value spread over several
    processes and replicated on none is gathered here, on every process (a
    collective: every process takes the same snapshot), so the chief alone can
    write it.
    """
    from keras_mgpu_plugins.backends.jax.values import snapshot_read as read

    return read(variable)


def host_value(variable: Any) -> Any:
    """`variable`'s whole value as a NumPy array, as `get_weights()` gives it.

    A value sharded over other processes' devices, replicated on none (a
    `layout_map` that shards over the `"batch"` axis), which `get_weights()`
    cannot read, is gathered: a collective then, which every process runs.
    """
    from keras_mgpu_plugins.backends.jax.values import host_value as read

    return read(variable)


def joined() -> None:
    """The job this process joined by the script's own means, `(rank, count)` (torch's process
    group only: on this backend the environment and the strategy say it, `None`)."""
    return None


def random_state() -> None:
    """No global generator of this backend's own that Keras's input pipeline draws from."""
    return None


def set_random_state(state: object) -> None:
    """Nothing to give back (`random_state`)."""
    return None


def row_span(rows: Any) -> None:
    """`None`: a random layer already draws over the global batch on JAX (its arrays
    are global: `kmp.parallelize(random_layers="one_device")` changes nothing here)."""
    return None


def count_step_flops(model: Any, original: Any, args: tuple) -> Any:
    """Runs one train step (`original(*args)`, Keras's train function) and counts its forward
    and backward FLOPs (`_flop_count.FlopCount`): see `backends/jax/flops.py`."""
    from keras_mgpu_plugins.backends.jax.flops import run_and_count

    return run_and_count(model, original, args)


def compute_devices() -> list[str]:
    """What each device of this process is, for its peak FLOP/s (`samplers.peaks`)."""
    from keras_mgpu_plugins.backends.jax.flops import compute_devices as kinds

    return kinds()


def float32_on_tensor_cores() -> bool:
    """Whether float32 matmuls may run on TF32 tensor cores here (their peak for MFU)."""
    from keras_mgpu_plugins.backends.jax.flops import float32_on_tensor_cores as tf32

    return tf32()


def step_pacer() -> Any:
    """What keeps one train step in flight (`backends/jax/pacing.py`): JAX dispatches
    asynchronously, so without it the time between steps is the host's, not the devices'."""
    from keras_mgpu_plugins.backends.jax.pacing import OneInFlight

    return OneInFlight()


def drop_fed(model: Any, count: int) -> None:
    """kmp keeps nothing per batch it feeds on this backend."""
