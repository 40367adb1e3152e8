"""`@parallelize`: build, compile and fit a model factory's model on every device of the job.

The arguments are checked here; the active Keras backend's folder does the rest
(`backends/tensorflow/parallelize.py`: a `tf.distribute` strategy; `backends/jax`:
`keras.distribution`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])


@overload
def parallelize(factory: F) -> F: ...


@overload
def parallelize(
    factory: None = None,
    *,
    strategy: Any = "auto",
    devices: Sequence[str] | Mapping[str, str] | None = None,
    require_compiled: bool = True,
    micro_batches: int | None = None,
    sync_batchnorm: bool = False,
    layout_map: Any = None,
    variable_partitioner: Any = "auto",
    min_shard_bytes: int | None = None,
    max_shards: int | None = None,
    random_layers: str = "per_replica",
) -> Callable[[F], F]: ...


def parallelize(
    factory: Callable[..., Any] | None = None,
    *,
    strategy: Any = "auto",
    devices: Sequence[str] | Mapping[str, str] | None = None,
    require_compiled: bool = True,
    micro_batches: int | None = None,
    sync_batchnorm: bool = False,
    layout_map: Any = None,
    variable_partitioner: Any = "auto",
    min_shard_bytes: int | None = None,
    max_shards: int | None = None,
    random_layers: str = "per_replica",
) -> Any:
    """Decorates a model factory so its model is built and compiled for several devices.

    The factory runs inside the strategy's scope, so its variables are mirrored
    and its optimizer belongs to the strategy; the model comes back built and
    compiled there, and `model.fit` distributes each global batch.

    `strategy="auto"` picks, from `kmp.topology()`: several workers (TF_CONFIG,
    SLURM, `kmp-launch`) → `MultiWorkerMirroredStrategy`; else several local
    devices → `MirroredStrategy`; else TensorFlow's default strategy. A
    multi-worker strategy is created when the decorator is applied, because
    TensorFlow needs it before its runtime starts; the Keras fixes of
    `kmp.compat.patch_keras()` are applied with it.

    Args:
        factory: The model factory, when used as a bare `@parallelize`.
        strategy: `"auto"`, `"mirrored"`, `"multi_worker"`, `"default"`,
            `"model_parallel"` (layer calls placed on several devices of this process:
            see docs/model_parallelism.md), `"hybrid"` (several workers train data
            parallel, each with the model placed over its own devices as
            `"model_parallel"` does; on one worker it is `"model_parallel"`), or a
            `"parameter_server"` (TensorFlow: the variables live on the cluster's parameter
            servers, the chief runs the script and sends the steps to the workers, which
            train asynchronously: docs/parameter_server.md; `"auto"` picks it when
            `TF_CONFIG`, or `kmp-launch --ps`, has `"ps"` tasks), or a
            `tf.distribute.Strategy` instance. One strategy per process: every
            factory decorated with the same choice shares it. A
            `MultiWorkerMirroredStrategy` of your own gets the Keras fixes of
            `kmp.compat.patch_keras()` too.
        devices: For `"mirrored"`: the devices to replicate on. For
            `"model_parallel"` and `"hybrid"`: the stage devices in order (default: every local GPU,
            else every local CPU device), or a mapping from layer-name patterns to devices.
        require_compiled: Raise if the factory returns an uncompiled model
            under a distributing strategy. With `False`, compile it later,
            anywhere: on TensorFlow a `compile` outside the scope runs in the
            model's strategy and takes the optimizer and metrics it is given
            into it (docs/parallelize.md, "Compiling again").
        micro_batches: For `"model_parallel"` and `"hybrid"`: split each batch into this many pieces
            in `fit` so stages work on different pieces at once (must divide the batch).
        sync_batchnorm: Make every `BatchNormalization` in the model compute
            its batch statistics over the global batch (all replicas and
            workers: Keras's `synchronized=True`), so several devices train
            as one device on the global batch. Default `False`: Keras's
            per-replica statistics (each replica normalises its own share).
        layout_map: JAX backend, `"model_parallel"` and `"hybrid"`: a
            `keras.distribution.LayoutMap` that lays the variables out instead of
            kmp's choice (large variables sharded along the `"model"` mesh axis); a
            key that matches no variable, or a layout that cannot shard a variable
            evenly, raises. Refused on TensorFlow (its model parallelism places layers,
            it does not shard variables).
        variable_partitioner: `"parameter_server"` only: how variables are split over
            the parameter servers. `"auto"`: along their first axis, in shards of at
            least `min_shard_bytes` and at most `max_shards` (an embedding table of
            millions of rows goes to every parameter server, a small kernel stays
            whole); `None`: every variable whole, placed round-robin; or a
            `tf.distribute.experimental.partitioners.Partitioner` of your own.
        min_shard_bytes: For `variable_partitioner="auto"`: the smallest shard
            (default 256 KiB, TensorFlow's advice).
        max_shards: For `variable_partitioner="auto"`: the most shards of one variable
            (default: the number of parameter servers).
        random_layers: `"per_replica"` (default): a Dropout, GaussianNoise or random
            augmentation layer draws on each replica (TensorFlow) or process (torch) for
            its own rows, other numbers than one device draws for the same rows.
            `"one_device"`: each draws one device's numbers for the global batch and keeps
            its rows, so N devices train as one device (one small all-gather and an N times
            larger draw per random layer and step). JAX draws over the global batch
            either way. In kmp-verify's runs it is `"one_device"`.

    Returns:
        The wrapped factory (same name, docstring and arguments), or a
        decorator when `factory` is not given.

    Raises:
        ValueError: For an unknown strategy name, an object that is not a
            strategy, or misplaced `devices`.
        StrategyError: If a multi-worker strategy is needed after TensorFlow's
            runtime started.

    Example:
        >>> @kmp.parallelize
        ... def build_model(units=64):
        ...     model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(units)])
        ...     model.compile(optimizer="adam", loss="mse")
        ...     return model
        >>> model = build_model(units=32)   # built and compiled under the strategy
    """
    if not isinstance(sync_batchnorm, bool):
        raise TypeError(f"sync_batchnorm must be True or False. Received: "
                        f"sync_batchnorm={sync_batchnorm!r}")
    if factory is not None and not callable(factory):
        raise TypeError(
            "parallelize takes a model factory (a callable) or keyword arguments. "
            f"Received: {factory!r}. Did you mean parallelize(strategy={factory!r})?"
        )
    from keras_mgpu_plugins import _backend, _fail_fast, _random_layers
    from keras_mgpu_plugins.cluster.partition import Partition
    from keras_mgpu_plugins.integrations import ray as ray_train
    from keras_mgpu_plugins.verify import _config as verify_run

    _random_layers.check(random_layers)
    if "ray.train" in sys.modules:  # a Ray Train worker: one job, or a clear error
        import keras

        from keras_mgpu_plugins.cluster.topology import topology

        ray_train.check_job(topology().num_workers, keras.backend.backend())

    _fail_fast.install_if_job()  # a process that raises must not keep its peers waiting

    partition = Partition(variable_partitioner, min_shard_bytes, max_shards)
    extra = {} if partition.is_default else {"partition": partition}
    decorated = _backend.active().parallelize_factory(
        factory, strategy=strategy, devices=devices, require_compiled=require_compiled,
        micro_batches=micro_batches, sync_batchnorm=sync_batchnorm, layout_map=layout_map,
        **extra)
    run = verify_run.current()  # a process of a kmp-verify run: its models are marked
    one_device = random_layers == "one_device" or (run is not None and run.random_layers ==
                                                   "one_device")
    if run is None and not one_device:
        return decorated
    return _each_model(decorated, factory is None, run is not None, one_device)


def _each_model(decorated: Any, is_decorator: bool, verifying: bool, one_device: bool) -> Any:
    """`decorated` (the wrapped factory, or the decorator), whose models draw one device's
    random numbers (`random_layers`) and, in a kmp-verify run, are marked as built by kmp
    and have their random layers note their rows (the noise run keeps their numbers)."""
    import functools

    def wrap(factory: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(factory)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from keras_mgpu_plugins import _random_layers
            from keras_mgpu_plugins.verify import _config as verify_run

            with verify_run.Building():
                model = factory(*args, **kwargs)
            if one_device or verifying:
                _random_layers.draw_as_one_device(model, one_device)
            return verify_run.mark_built(model) if verifying else model

        return wrapper

    return (lambda fn: wrap(decorated(fn))) if is_decorator else wrap(decorated)
