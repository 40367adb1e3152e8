"""`@kmp.parallelize` on torch: one process per device, DDP-style data parallelism over them.

The decorator checks its arguments (what torch cannot run alike is refused here, naming
the backend, the setting and the alternative); the wrapper joins the job's process group
(`group.initialize`: torchrun, `kmp-launch`, SLURM), builds the model, and, with several
processes, makes it train as one device on the global batches: `fit`/`evaluate`/`predict`
arranged (`methods`, patch `torch_one_model_per_job`), its steps weighted and its logs
global (`steps`, `torch_steps_as_one_device`), its optimizers averaging the processes'
gradients (`gradients`, `torch_gradients_averaged`: upstream's DistributedDataParallel
where Keras has it), BatchNormalization synchronised on request (`batchnorm`). In one
process the factory runs as is.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

_DATA_PARALLEL = ("auto", "mirrored", "multi_worker")
_MODEL_PARALLEL = ("model_parallel", "hybrid")
_UPSTREAM_MP = "https://github.com/keras-team/keras/pull/23418"


def parallelize_torch(factory: Callable[..., Any] | None, strategy: Any, devices: Any,
                      require_compiled: bool, micro_batches: Any, sync_batchnorm: bool,
                      layout_map: Any = None, partition: Any = None) -> Any:
    """`kmp.parallelize` on torch (see its docstring): the arguments checked, the decorator."""
    check_arguments(strategy, devices, micro_batches, layout_map, partition)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if strategy == "default":
                return fn(*args, **kwargs)
            from keras_mgpu_plugins.backends.torch import group

            if not group.initialize():
                _say_one_process(strategy)
                return fn(*args, **kwargs)
            return adopt(_checked(fn, fn(*args, **kwargs), require_compiled), sync_batchnorm)

        return wrapper

    return decorate(factory) if factory is not None else decorate


def adopt(model: Any, sync_batchnorm: bool) -> Any:
    """Makes `model` train over every process of the job (the patches of the module docstring;
    they fail closed outside the Keras versions they were checked on)."""
    import keras

    from keras_mgpu_plugins.backends.torch import models, parallel
    from keras_mgpu_plugins.compat import all_layers, apply_to
    from keras_mgpu_plugins.compat._registry import apply

    apply("torch_one_model_per_job")
    apply_to("torch_steps_as_one_device", model)
    if sync_batchnorm:
        for layer in all_layers(model):
            if isinstance(layer, keras.layers.BatchNormalization):
                apply_to("torch_sync_batchnorm", layer)
    models.register(model, sync_batchnorm)
    parallel.average_gradients_of(model)
    parallel.broadcast_state(model)  # built models: the same weights from here on
    return model


def check_arguments(strategy: Any, devices: Any, micro_batches: Any, layout_map: Any,
                    partition: Any = None) -> None:
    """Raises for what torch cannot run as asked, naming the setting and the alternative."""
    if strategy == "parameter_server" or partition is not None:
        setting = (f"strategy={strategy!r}" if strategy == "parameter_server"
                   else partition.describe())
        raise ValueError(
            f"{setting} is TensorFlow's parameter-server training (tf.distribute's "
            "ParameterServerStrategy, variable_partitioner); Keras has none on the torch "
            "backend (beyond TensorFlow it is a Keras proposal, keras-team/keras#20753). Use "
            "KERAS_BACKEND=tensorflow for parameter servers, or strategy='multi_worker' / "
            "'auto' (data parallel over the processes: kmp-launch -n N, torchrun "
            "--nproc-per-node N).")
    if not isinstance(strategy, str):
        raise ValueError(
            "A strategy object is TensorFlow's (tf.distribute) and does not apply on the torch "
            f"backend. Received: strategy={strategy!r}. Use strategy='auto' (data parallel "
            "over every process: kmp-launch -n N, torchrun --nproc-per-node N) or 'default'.")
    if strategy in _MODEL_PARALLEL or layout_map is not None:
        setting = f"strategy={strategy!r}" if layout_map is None else "layout_map=..."
        raise ValueError(
            f"{setting} is not available on the torch backend: Keras's model parallelism on "
            f"torch is still being written upstream ({_UPSTREAM_MP}, keras-team/keras#23418). "
            "Use strategy='auto' (data parallel over the processes) with a model that fits one "
            "device, or KERAS_BACKEND=jax (sharded variables) or KERAS_BACKEND=tensorflow "
            "(layers placed on devices) for model parallelism.")
    if strategy not in (*_DATA_PARALLEL, "default"):
        raise ValueError(f"strategy must be one of 'auto', 'mirrored', 'multi_worker', "
                         f"'default'. Received: strategy={strategy!r}")
    if micro_batches is not None:
        raise ValueError("micro_batches (pipeline stages) needs strategy='model_parallel', "
                         "which the torch backend does not have (keras-team/keras#23418). "
                         f"Received: micro_batches={micro_batches!r}. Leave it None.")
    if devices is not None:
        raise ValueError(
            "devices is not available on the torch backend: each process drives one device "
            "(the GPU LOCAL_RANK names, or the CPU), and several devices are several "
            f"processes (kmp-launch -n N train.py). Received: devices={devices!r}. Choose "
            "GPUs with CUDA_VISIBLE_DEVICES instead.")


def _say_one_process(strategy: str) -> None:
    """One process, several GPUs: torch trains on one; say how to use all."""
    from keras_mgpu_plugins.backends.torch import devices

    names = devices.local_device_names()
    if len(names) > 1:
        message = (f"kmp.parallelize(strategy={strategy!r}) on torch runs one device per "
                   f"process; this process sees {len(names)} GPUs and trains on "
                   f"{devices.device_name()} only. Start one process per GPU: kmp-launch -n "
                   f"{len(names)} train.py, or torchrun --nproc-per-node {len(names)} train.py.")
        if strategy == "mirrored":
            raise ValueError(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def _checked(fn: Callable[..., Any], model: Any, require_compiled: bool) -> Any:
    import keras

    name = getattr(fn, "__qualname__", repr(fn))
    if not isinstance(model, keras.Model):
        raise TypeError(f"The factory {name} decorated with @parallelize must return a "
                        f"keras.Model. Received: an object of type {type(model).__name__}")
    if require_compiled and not getattr(model, "compiled", False):
        raise ValueError(
            f"The factory {name} returned an uncompiled model. Call model.compile(...) inside "
            "the factory, or pass @parallelize(require_compiled=False) and compile it before "
            "fit.")
    return model
