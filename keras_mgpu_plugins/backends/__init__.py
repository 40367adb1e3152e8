"""One folder per Keras backend: what kmp does with that backend's own distribution API.

The rest of the package is backend-free: it reaches a backend only through `current()`
(and `kmp.runtime.of(model)`, built on it). Each backend package offers the same small
set of functions, importing its framework only when one is called:

- `runtime_of(model)`: the `kmp.runtime.Runtime` the model trains under;
- `simulate_devices(n, memory_limit_mb)`: split this process's device (`kmp.simulate_devices`);
- `local_device_names()`: this process's devices, e.g. `("GPU:0", "GPU:1")`;
- `gpu_memory()`: this process's GPUs and their allocators (`samplers.gpu.GPUMemory`:
  `devices`, `read(name)`, `reset_peak(name)`), the framework bound once;
- `read_variable(variable)`: a snapshot read of a Keras variable (its values of this
  moment, copied only where the backend must);
- `host_value(variable)`: a Keras variable's whole value as a NumPy array, as
  `get_weights()` gives it (gathered from the other processes where it spans them);
- `remote_files()`: an object with `tf.io.gfile`'s file functions, for `gs://`-style paths;
- `summary_writer(logdir)`: TensorBoard scalars, `write(step, {tag: value})` and `close()`;
- `parallelize_factory(factory, **options)`: `kmp.parallelize` on this backend;
- `join_job()`: join a multi-worker job before any user code (`kmp-launch` workers,
  `python -m keras_mgpu_plugins.run`): TensorFlow's strategy, `jax.distributed`, or torch's
  process group;
- `serve_parameter_server(topology)` (TensorFlow only: `run.prepare` refuses parameter
  servers on other backends first): a worker or parameter server of a parameter-server
  cluster runs TensorFlow's server and never returns;
- `joined()`: `(rank, count)` of a job this process joined by the script's own means (a
  torch process group it started itself), else `None` (`kmp.topology()` asks it).
"""

from __future__ import annotations

import os
from types import ModuleType

#: The frameworks behind Keras's backends, and kmp's extra that installs each.
_EXTRAS = {"tensorflow": "tensorflow", "jax": "jax", "jaxlib": "jax", "torch": "torch"}


def require_keras() -> ModuleType:
    """`import keras`, with an error naming kmp's extras when its backend is not installed.

    Raises:
        ImportError: If Keras's backend framework (`KERAS_BACKEND`, default
            TensorFlow) is missing.
    """
    try:
        import keras
    except ModuleNotFoundError as err:
        if err.name not in _EXTRAS:
            raise
        backend = os.environ.get("KERAS_BACKEND", "tensorflow (Keras's default)")
        extra = _EXTRAS[err.name]
        fix = f'pip install "keras_mgpu_plugins[{extra}]"'
        raise ImportError(
            f"Keras's backend is {backend}, but {err.name!r} is not installed. Install it "
            f"({fix}), or choose an installed backend with KERAS_BACKEND. kmp's lanes: "
            'pip install "keras_mgpu_plugins[tensorflow]" (tf.distribute), '
            'pip install "keras_mgpu_plugins[jax]" with KERAS_BACKEND=jax (keras.distribution) or '
            'pip install "keras_mgpu_plugins[torch]" with KERAS_BACKEND=torch (one process per '
            "device, DistributedDataParallel)."
        ) from err
    return keras


def current() -> ModuleType:
    """The backend package of the active Keras backend (`keras.backend.backend()`)."""
    keras = require_keras()

    name = keras.backend.backend()
    if name == "tensorflow":
        from keras_mgpu_plugins.backends import tensorflow

        return tensorflow
    if name == "jax":
        from keras_mgpu_plugins.backends import jax

        return jax
    if name == "torch":
        from keras_mgpu_plugins.backends import torch

        return torch
    from keras_mgpu_plugins.backends import single

    return single
