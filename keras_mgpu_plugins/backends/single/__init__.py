"""Keras backends without a distributed `fit` (numpy): one process, one device.

Every callback works here (the runtime is the single-process identity); distributing
raises, naming what to use instead.
"""

from __future__ import annotations

import os
from typing import Any


def _backend() -> str:
    import keras

    return keras.backend.backend()


def runtime_of(model: Any = None) -> Any:
    """The single-process identity runtime."""
    from keras_mgpu_plugins.runtime import SingleProcess

    return SingleProcess()


def saving_in_a_job() -> str:
    """No job of several processes on this backend (messages)."""
    return "this backend trains in one process only"


def apart(model: Any) -> None:
    """One process: no model trains apart from others (`runtime.apart`)."""
    return None


def simulate_devices(n: int, memory_limit_mb: int | None = None) -> list[str]:
    """One device only: Keras has no distributed `fit` on this backend."""
    if n == 1:
        return ["CPU:0"]
    raise NotImplementedError(
        f"kmp.simulate_devices({n}) splits a device for distributed fit, which Keras does not "
        f"offer on the {_backend()!r} backend. Use KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow "
        "(pip install 'keras_mgpu_plugins[jax]' or '[tensorflow]')."
    )


def local_device_names() -> tuple[str, ...]:
    """The GPUs torch sees (`GPU:0`, ...), else `("CPU:0",)`."""
    import sys

    torch = sys.modules.get("torch") if _backend() == "torch" else None
    if torch is not None and torch.cuda.is_available():
        return tuple(f"GPU:{i}" for i in range(torch.cuda.device_count())) or ("CPU:0",)
    return ("CPU:0",)


def gpu_memory() -> Any:
    """No GPU is read on this backend (`samplers.gpu.GPUMemory` with no devices)."""
    from types import SimpleNamespace

    return SimpleNamespace(devices=[], read=lambda name: None, reset_peak=lambda name: None)


def read_variable(variable: Any) -> Any:
    """A host copy of a Keras variable's values (torch and NumPy update variables in place;
    `keras.ops.convert_to_numpy` detaches a torch tensor from autograd and moves it off the
    GPU)."""
    import keras
    import numpy as np

    return np.array(keras.ops.convert_to_numpy(variable.value), copy=True)


def host_value(variable: Any) -> Any:
    """`variable`'s whole value as a NumPy array, as `get_weights()` gives it."""
    return variable.numpy()


def remote_files() -> Any:
    """Remote paths need TensorFlow's file systems."""
    raise NotImplementedError(
        f"Remote paths (gs://, s3://, hdfs://) are written through tf.io.gfile, which the "
        f"{_backend()!r} backend does not load. Write to a local path, or use the TensorFlow "
        "backend."
    )


def summary_writer(logdir: str) -> Any:
    """TensorBoard event files need TensorFlow's writer (`write(step, scalars)`, `close()`)."""
    raise NotImplementedError(
        f"TensorBoard event files are written with tf.summary, which the {_backend()!r} "
        "backend does not load. Log to CSV or W&B, or use the TensorFlow backend."
    )


def parallelize_factory(factory: Any, *, strategy: Any, devices: Any, require_compiled: bool,
                micro_batches: Any, sync_batchnorm: bool, layout_map: Any = None,
                partition: Any = None) -> Any:
    """`kmp.parallelize` on a backend without distributed `fit`: the factory runs as is on
    one device; anything that would distribute raises, naming what to use."""
    import functools

    from keras_mgpu_plugins.cluster.topology import topology_from_env

    if strategy == "parameter_server" or partition is not None:
        raise NotImplementedError(
            f"strategy='parameter_server' (and variable_partitioner, min_shard_bytes, "
            f"max_shards) is TensorFlow's parameter-server training (tf.distribute's "
            f"ParameterServerStrategy); Keras has none on the {_backend()!r} backend (for "
            f"JAX it is a Keras proposal, keras-team/keras#20753). Received: "
            f"strategy={strategy!r}. Use KERAS_BACKEND=tensorflow for parameter servers, or "
            "strategy='multi_worker' for data-parallel training over every process where the "
            "backend offers it (JAX).")

    topo = topology_from_env(os.environ, local_device_names())
    wants = (strategy not in ("auto", "default") or devices is not None
             or micro_batches is not None or sync_batchnorm or layout_map is not None)
    several = strategy != "default" and (topo.is_multi_worker or topo.num_local_devices > 1)
    if wants or several:
        raise NotImplementedError(
            f"Keras has no distributed fit on the {_backend()!r} backend, so @kmp.parallelize "
            f"cannot spread this model (strategy={strategy!r}, {topo.num_workers} worker(s), "
            f"{topo.num_local_devices} local device(s)). Use KERAS_BACKEND=jax or "
            "KERAS_BACKEND=tensorflow (pip install 'keras_mgpu_plugins[jax]' or "
            "'[tensorflow]'), or one device: strategy='default', or CUDA_VISIBLE_DEVICES=0."
        )

    def decorate(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    return decorate(factory) if factory is not None else decorate


def join_job() -> None:
    """Several processes cannot train together: Keras has no distributed `fit` here."""
    raise NotImplementedError(
        f"This job has several workers, but Keras has no distributed fit on the {_backend()!r} "
        "backend. Use KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow (pip install "
        "'keras_mgpu_plugins[jax]' or '[tensorflow]'), or run one worker."
    )


def serve_parameter_server(topology: Any) -> None:
    """Parameter servers are TensorFlow's: refused on this backend."""
    raise NotImplementedError(
        f'TF_CONFIG describes a parameter-server cluster (task type "ps"), which Keras trains on '
        f"the TensorFlow backend only (for JAX it is a Keras proposal, keras-team/keras#20753); "
        f"this is the {_backend()!r} backend. Use KERAS_BACKEND=tensorflow, or remove the "
        '"ps" tasks.')


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
    """`None`: one device: a random layer draws for the whole batch."""
    return None


def count_step_flops(model: Any, original: Any, args: tuple) -> Any:
    """Runs one train step; no FLOP counter on this backend (`FlopCount.absent`)."""
    from keras_mgpu_plugins._flop_count import FlopCount

    return original(*args), FlopCount.absent(f"kmp counts no FLOPs on the {_backend()!r} "
                                              "backend (TensorFlow, JAX and torch only)")


def compute_devices() -> list[str]:
    return ["cpu"]


def float32_on_tensor_cores() -> bool:
    return False


def step_pacer() -> None:
    """`None`: no backend of kmp's: the steps are timed as Keras runs them."""
    return None


def drop_fed(model: Any, count: int) -> None:
    """kmp keeps nothing per batch it feeds on this backend."""
