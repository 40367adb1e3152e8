"""One folder per Keras backend: what kmp does with that backend's own distribution API.

The rest of the package is backend-free: it never imports this dispatcher (the backends
build on it: that would be an import circle). This module hands `current()` to
`_backend.provide` when it is imported (the package's `__init__` imports it first), and
the backend-free code asks `_backend.active()` (and `kmp.runtime.of(model)`, built on
it). Each backend package offers the same small set of functions, importing its
framework only when one is called:

- `runtime_of(model)`: the `kmp.runtime.Runtime` the model trains under;
- `apart(model)`: why `model` would train a separate model on each of the job's processes
  (not built under the job's distribution), in the lane's words, or `None` where it trains
  as one with them (`runtime.apart` decides the rest);
- `saving_in_a_job()`: what saving the model takes in a job of several processes on this
  lane, in its words (messages that refuse a writer without rank logic);
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
- `row_span(rows)`: in a distributed step, where this replica's (or process's) `rows` of the
  global batch start and how many rows it has, `(offset, total)`, else `None`
  (`kmp.parallelize(random_layers="one_device")`);
- `joined()`: `(rank, count)` of a job this process joined by the script's own means (a
  torch process group it started itself), else `None` (`kmp.topology()` asks it);
- `random_state()`, `set_random_state(state)`: the framework's own global generators that
  Keras draws from (torch: its `DataLoader` shuffle, an unseeded Dropout's masks), as JSON
  values, or `None` where there is none; `BackupAndRestore` records them at each epoch's
  start and at the backup's step;
- `count_step_flops(model, original, args)`: runs one train step (Keras's train function
  `original`) and counts its forward and backward FLOPs (`_flop_count.FlopCount`);
  `compute_devices()`: what each local device is (its name, `"cpu"`);
  `float32_on_tensor_cores()`: whether float32 matmuls may use TF32 (for the peak);
  `step_pacer()`: a callable given each train step's result that keeps one step in flight
  (JAX's asynchronous dispatch), else `None`;
- `drop_fed(model, count)`: `count` batches kmp fed were drawn and not trained (a resumed
  epoch's first): what kmp kept for their steps is dropped (torch's `StepInfo`s).
"""

from __future__ import annotations

from types import ModuleType

from keras_mgpu_plugins._backend import provide, require_keras

__all__ = ["current", "require_keras"]


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


provide(current)  # the backend-free folders reach the active backend through `_backend`
