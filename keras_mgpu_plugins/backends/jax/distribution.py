"""`@kmp.parallelize` on JAX: `jax.distributed` for several processes, `keras.distribution` over them.

`initialize()` starts `jax.distributed` from the environment (the launcher's
`TF_CONFIG`, SLURM, or Keras's `KERAS_DISTRIBUTION_*` variables); `parallelize_jax`
builds the factory's model under a `keras.distribution.DataParallel` over every
device of every process, and makes its `fit`/`evaluate`/`predict` run under it and
feed each process its share of every global batch (`backends.jax.methods`, `.data`): the
distribution is the model's, in force in its own methods only, never the whole process's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.cluster.processes import (  # noqa: F401 - Keras's names, re-exported
    KERAS_ADDRESSES,
    KERAS_NUM_PROCESSES,
    KERAS_PROCESS_ID,
    Plan,
    planned_processes,
)

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
_DATA_PARALLEL = ("auto", "mirrored", "multi_worker")
_SHARDED = ("model_parallel", "hybrid")


def initialize(plan: Plan | None = None) -> bool:
    """Starts `jax.distributed` for the job the environment describes. Idempotent.

    Must run before any JAX computation. A local job's coordinator (every
    address on this host) binds to 127.0.0.1 only. CPU collectives are gloo
    (`jax_cpu_collectives_implementation`, JAX's default). The processes then
    agree on Keras's random seed (Keras's own `initialize_rng`, as
    `keras.distribution.initialize` does), so unseeded initialisers create the
    same weights on every process; Keras's progress bars are shown on the chief
    only (`KMP_OUTPUT=all`: on every process), and `fit` checks that every process
    was given the same kmp callbacks, as on TensorFlow.

    Returns:
        Whether this process is one of several (`jax.distributed` initialised).
    """
    import jax

    from keras_mgpu_plugins.compat import check_keras_for_distribution

    if jax.distributed.is_initialized():  # by kmp, or by the script (keras.distribution)
        several = jax.process_count() > 1
        if several:
            check_keras_for_distribution()
            _install_worker_checks()
        return several
    plan = plan or planned_processes()
    if plan is None:
        return False
    check_keras_for_distribution()  # the version policy of every lane, before Keras's code
    host, _, port = plan.coordinator_address.rpartition(":")
    bind = f"127.0.0.1:{port}" if host in _LOCAL_HOSTS else None
    if jax.config.jax_cpu_collectives_implementation in (None, ""):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(plan.coordinator_address, plan.num_processes, plan.process_id,
                               coordinator_bind_address=bind)
    _agree_on_seed()
    _install_worker_checks()
    return True


def _install_worker_checks() -> None:
    """Once this process is one of several, as TensorFlow's multi-worker strategy does:
    progress bars on the chief only (`KMP_OUTPUT=all`: on every process), and every
    `fit` first checks its kmp callbacks against the other processes'. Idempotent; both
    read the rank at each call."""
    from keras_mgpu_plugins import _same_callbacks, _worker_output

    _worker_output.install()
    _same_callbacks.install()


def _agree_on_seed() -> None:
    """Keras's `initialize_rng` (what `keras.distribution.initialize` runs after JAX's)."""
    from keras_mgpu_plugins.compat._private import jax_initialize_rng

    if jax_initialize_rng():
        return
    import keras
    import numpy as np

    from keras_mgpu_plugins.backends.jax.runtime import JaxRuntime

    seed = JaxRuntime().broadcast(np.array([np.random.SeedSequence().entropy % 2**31]))
    keras.utils.set_random_seed(int(seed[0]))


def parallelize_jax(factory: Callable[..., Any] | None, strategy: Any, devices: Any,
                    require_compiled: bool, micro_batches: Any, sync_batchnorm: bool,
                    layout_map: Any = None) -> Any:
    """`kmp.parallelize` on JAX (see its docstring): the arguments checked, the decorator."""
    _check_strategy(strategy, devices, micro_batches, layout_map)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            distribution = _distribution(strategy, devices, layout_map)
            if distribution is None:
                return _checked(fn, fn(*args, **kwargs), False, require_compiled)
            from keras_mgpu_plugins.compat import check_keras_for_distribution

            check_keras_for_distribution()  # the version policy of every lane
            with distribution.scope():  # the model's variables laid out as they are created
                model = _checked(fn, fn(*args, **kwargs), True, require_compiled)
            from keras_mgpu_plugins.backends.jax import methods

            methods.run_under(model, distribution)
            if strategy in _SHARDED:
                from keras_mgpu_plugins.backends.jax import memory, model_parallel

                model_parallel.check_keys(model, distribution)
                model_parallel.record(model, distribution)
                memory.check_every_process(model, strategy)  # before any step allocates more
            return model

        wrapper.strategy = lambda: _distribution(  # type: ignore[attr-defined]
            strategy, devices, layout_map)
        return wrapper

    return decorate(factory) if factory is not None else decorate


#: Why the JAX backend refuses parameter servers, and what to use instead.
PARAMETER_SERVER_REFUSAL = (
    "strategy='parameter_server' is TensorFlow's (tf.distribute's ParameterServerStrategy): "
    "Keras has no parameter-server training on JAX (a Keras proposal: "
    "keras-team/keras#20753). Use strategy='multi_worker' (or 'auto'): every process trains "
    "data parallel, synchronously (keras.distribution.DataParallel); or KERAS_BACKEND="
    "tensorflow for parameter servers.")


def refuse_partition(strategy: Any, partition: Any) -> None:
    """Raises for the parameter-server arguments (TensorFlow's only) on JAX."""
    if strategy == "parameter_server":
        raise ValueError(f"{PARAMETER_SERVER_REFUSAL} Received: strategy={strategy!r}")
    if partition is not None:
        raise ValueError(
            "variable_partitioner, min_shard_bytes and max_shards split variables over "
            "TensorFlow's parameter servers, which Keras has not on JAX (keras-team/keras#20753)."
            f" Received: {partition.describe()}. On JAX, strategy='model_parallel' shards large "
            "variables over the devices (layout_map to choose how).")


def _check_strategy(strategy: Any, devices: Any, micro_batches: Any, layout_map: Any) -> None:
    if strategy == "parameter_server":
        raise ValueError(f"{PARAMETER_SERVER_REFUSAL} Received: strategy={strategy!r}")
    if not isinstance(strategy, str):
        raise ValueError(
            "A strategy object is TensorFlow's (tf.distribute) and does not apply on the JAX "
            f"backend. Received: strategy={strategy!r}. Use strategy='auto' (DataParallel over "
            "every device of every process) or 'default' (no distribution).")
    if strategy not in (*_DATA_PARALLEL, "default", *_SHARDED):
        raise ValueError(f"strategy must be one of 'auto', 'mirrored', 'multi_worker', 'default', "
                         f"'model_parallel', 'hybrid'. Received: strategy={strategy!r}")
    if micro_batches is not None:
        raise ValueError(
            "micro_batches is not available on the JAX backend: strategy='model_parallel' and "
            "'hybrid' shard each large variable over the devices (every device works on every "
            "layer at once), so there are no pipeline stages to overlap. Received: "
            f"micro_batches={micro_batches!r}, strategy={strategy!r}. Leave micro_batches=None. "
            "To hold the activations of a smaller batch per step, pass fit(batch_size=B // k) "
            "and the optimizer's gradient_accumulation_steps=k: it trains as batch_size=B on "
            "one device (docs/model_parallelism.md, 'Limits on JAX').")
    if layout_map is not None and strategy not in _SHARDED:
        raise ValueError(f"layout_map only applies to strategy='model_parallel' or 'hybrid'. "
                         f"Received: strategy={strategy!r}, layout_map={layout_map!r}")
    if devices is not None and strategy not in ("mirrored", *_SHARDED):
        raise ValueError(f"devices only applies to strategy='mirrored', 'model_parallel' or "
                         f"'hybrid'. Received: strategy={strategy!r}, devices={devices!r}")


def _distribution(strategy: str, devices: Any, layout_map: Any = None) -> Any:
    """The `DataParallel` over every device of every process (`None` for "default", and on a
    job of one device: plain Keras), or a fresh `ModelParallel` for "model_parallel" and
    "hybrid" (`backends.jax.model_parallel`)."""
    if strategy == "default":
        return None
    initialize()
    import jax
    import keras

    if strategy in _SHARDED:
        from keras_mgpu_plugins.backends.jax import model_parallel

        return model_parallel.distribution(devices, layout_map, strategy == "hybrid")

    if jax.device_count() == 1 and (devices is None or len(devices) == 1):
        # One device in the whole job: plain Keras, as TensorFlow's "auto" gives no strategy
        # there. A DataParallel of one device compiles the train step twice more than plain
        # Keras (its variables, made on the device, are not laid out on the one-device mesh
        # the step's outputs are, nor are its metrics' after a reset) and lays out each batch.
        return None
    if devices is not None:
        if jax.process_count() > 1:
            raise ValueError("devices names this process's devices; with several processes the "
                             "distribution spans every process's devices. Received: "
                             f"devices={devices!r}. Leave devices=None.")
        names = [str(d) for d in devices]
        known = keras.distribution.list_devices()
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"devices must name this process's devices {known}. Received: "
                             f"devices={names!r}")
        return keras.distribution.DataParallel(devices=names, auto_shard_dataset=False)
    current = keras.distribution.distribution()
    if (isinstance(current, keras.distribution.DataParallel)
            and current.device_mesh.devices.size == jax.device_count()):
        return current  # one distribution per process: every factory shares it
    return keras.distribution.DataParallel(auto_shard_dataset=False)


def _checked(fn: Callable[..., Any], model: Any, distributing: bool, require_compiled: bool) -> Any:
    import keras

    name = getattr(fn, "__qualname__", repr(fn))
    if not isinstance(model, keras.Model):
        raise TypeError(f"The factory {name} decorated with @parallelize must return a "
                        f"keras.Model. Received: an object of type {type(model).__name__}")
    if require_compiled and distributing and not getattr(model, "compiled", False):
        raise ValueError(
            f"The factory {name} returned an uncompiled model. Call model.compile(...) inside "
            "the factory, so its optimizer's variables are created under the distribution, or "
            "pass @parallelize(require_compiled=False).")
    return model
