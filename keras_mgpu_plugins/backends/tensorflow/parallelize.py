"""`@kmp.parallelize` on TensorFlow: the factory runs in a `tf.distribute` strategy's scope."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.backends.tensorflow import strategy as _strategy
from keras_mgpu_plugins.cluster.topology import topology


def parallelize(factory: Callable[..., Any] | None, *, strategy: Any, devices: Any,
                require_compiled: bool, micro_batches: int | None,
                sync_batchnorm: bool, partition: Any = None) -> Any:
    """`kmp.parallelize` on TensorFlow (arguments checked and documented there)."""
    if isinstance(strategy, str) and strategy not in _strategy.PARALLELIZE_NAMES:
        raise ValueError(f"strategy must be one of {list(_strategy.PARALLELIZE_NAMES)} or a "
                         f"tf.distribute.Strategy instance. Received: strategy={strategy!r}")
    if isinstance(strategy, str) and strategy not in ("model_parallel", "hybrid") and (
            _strategy.resolve_name(strategy, topology()) == "parameter_server"):
        return _parameter_server(factory, devices, require_compiled, micro_batches,
                                 sync_batchnorm, partition)
    if partition is not None:
        raise ValueError(
            "variable_partitioner, min_shard_bytes and max_shards split variables over "
            "parameter servers: they apply to strategy='parameter_server' (or 'auto' in a "
            f"cluster with \"ps\" tasks). Received: strategy={strategy!r}, {partition.describe()}")
    if strategy == "model_parallel":
        if sync_batchnorm:
            raise ValueError(
                "sync_batchnorm applies to data-parallel strategies; strategy='model_parallel' "
                "trains one replica, whose BatchNormalization already normalises over the whole "
                "batch (with micro_batches: over each piece). Received: sync_batchnorm=True"
            )
        return _model_parallel(factory, devices, micro_batches)
    if strategy == "hybrid":
        if sync_batchnorm:
            raise ValueError(
                "sync_batchnorm is not available with strategy='hybrid': each worker's "
                "BatchNormalization normalises over its own share of the global batch. "
                "Received: sync_batchnorm=True"
            )
        return _hybrid(factory, devices, micro_batches)
    if micro_batches is not None:
        raise ValueError(f"micro_batches only applies to strategy='model_parallel' or "
                         f"'hybrid'. Received: strategy={strategy!r}, "
                         f"micro_batches={micro_batches!r}")
    if isinstance(strategy, str):
        name = _strategy.resolve_name(strategy, topology())
        if name == "multi_worker":
            _strategy.get_strategy(strategy, devices)  # now, before TF's runtime starts
        elif devices is not None and name != "mirrored":
            raise ValueError(
                f"devices only applies to the mirrored strategy, but strategy={strategy!r} "
                f"resolves to {name!r}. Received: devices={list(devices)!r}"
            )
    else:
        _strategy.check_instance(strategy, devices, _strategy.PARALLELIZE_NAMES)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            active = _strategy.get_strategy(strategy, devices)
            _patch_if_distributing(active)
            with active.scope():
                model = fn(*args, **kwargs)
            _check_model(fn, model, active, require_compiled)
            _adopt_in_overridden_compile(model, active)
            _sum_duplicate_slices(model)
            if sync_batchnorm:
                _synchronize_batchnorm(model)
            return model

        wrapper.strategy = lambda: _strategy.get_strategy(strategy, devices)  # type: ignore[attr-defined]
        return wrapper

    return decorate(factory) if factory is not None else decorate


def _parameter_server(factory: Callable[..., Any] | None, devices: Any, require_compiled: bool,
                      micro_batches: Any, sync_batchnorm: bool, partition: Any) -> Any:
    """`@parallelize(strategy="parameter_server")`: see `backends.tensorflow.parameter_server`.

    On a worker or parameter server of the cluster this serves and never returns (only the
    chief runs the script on); on the chief it connects to the cluster now.
    """
    for name, value, default in (("devices", devices, None), ("micro_batches", micro_batches, None),
                                 ("sync_batchnorm", sync_batchnorm, False)):
        if value != default:
            raise ValueError(
                f"{name} does not apply to strategy='parameter_server': each worker runs whole "
                "steps of the model on its own device, asynchronously, with the variables on "
                f"the parameter servers. Received: {name}={value!r}. Leave {name} out.")
    from keras_mgpu_plugins.backends.tensorflow.parameter_server import report

    topo = topology()
    if topo.serves:
        from keras_mgpu_plugins.backends.tensorflow.parameter_server.cluster import serve

        serve(topo)
    _strategy.get_strategy("parameter_server", partition=partition)  # connect now

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            active = _strategy.get_strategy("parameter_server", partition=partition)
            with active.scope():
                model = fn(*args, **kwargs)
            _check_model(fn, model, active, require_compiled)
            _sum_duplicate_slices(model)
            report.record(model, topo.num_ps)  # kmp.placement_report: the parameter servers
            return model

        wrapper.strategy = lambda: _strategy.get_strategy(  # type: ignore[attr-defined]
            "parameter_server", partition=partition)
        return wrapper

    return decorate(factory) if factory is not None else decorate


def _check_model(fn: Callable[..., Any], model: Any, active: Any, require_compiled: bool) -> None:
    import keras
    import tensorflow as tf

    name = getattr(fn, "__qualname__", repr(fn))
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"The factory {name} decorated with @parallelize must return a keras.Model. "
            f"Received: an object of type {type(model).__name__}"
        )
    from keras_mgpu_plugins import compat

    in_a_strategy = active is not tf.distribute.get_strategy() or compat.distributing(active)
    if require_compiled and in_a_strategy and not getattr(model, "compiled", False):
        raise ValueError(
            f"The factory {name} returned an uncompiled model. Call model.compile(...) "
            "inside the factory, or pass @parallelize(require_compiled=False) and compile "
            "the model later (a compile outside the factory runs in the model's strategy "
            "and takes the optimizer and metrics it is given into it)."
        )


def _model_parallel(factory: Callable[..., Any] | None, devices: Any, micro_batches: Any) -> Any:
    """`@parallelize(strategy="model_parallel")`: see `keras_mgpu_plugins.model_parallel`."""
    from keras_mgpu_plugins.backends.tensorflow.model_parallel import factory as build

    build.check_arguments(devices, micro_batches, topology().num_workers)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return build.build(fn, args, kwargs, devices, micro_batches)

        wrapper.strategy = lambda: _strategy.get_strategy("default", None)  # type: ignore[attr-defined]
        return wrapper

    return decorate(factory) if factory is not None else decorate


def _hybrid(factory: Callable[..., Any] | None, devices: Any, micro_batches: Any) -> Any:
    """`@parallelize(strategy="hybrid")`: see `keras_mgpu_plugins.backends.tensorflow.model_parallel.hybrid`."""
    from keras_mgpu_plugins.backends.tensorflow.model_parallel import factory as build
    from keras_mgpu_plugins.backends.tensorflow.model_parallel import hybrid

    build.check_arguments(devices, micro_batches, 1)
    hybrid.prepare()  # the multi-worker strategy now, before TF's runtime starts

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hybrid.build(fn, args, kwargs, devices, micro_batches)

        wrapper.strategy = lambda: (hybrid.prepare()  # type: ignore[attr-defined]
                                    or _strategy.get_strategy("default", None))
        return wrapper

    return decorate(factory) if factory is not None else decorate


def _patch_if_distributing(active: Any) -> None:
    """Applies `kmp.compat.patch_keras()` for any strategy that spans replicas or workers."""
    from keras_mgpu_plugins import compat

    if compat.distributing(active):
        compat.patch_keras()


def _adopt_in_overridden_compile(model: Any, active: Any) -> None:
    """A model class's own `compile` takes in the optimizers it keeps itself, as Keras's
    `compile` takes in its arguments (`kmp.compat` patches `compile_adopts_state_made_outside`
    and `overridden_compile_adopts_its_arguments`)."""
    import keras

    from keras_mgpu_plugins import compat

    if type(model).compile is not keras.Model.compile and compat.distributing(active):
        compat.apply_to("overridden_compile_adopts_its_arguments", model, active)


def _sum_duplicate_slices(model: Any) -> None:
    """Sparse gradients are summed per row on one device too, as on N (`kmp.compat` patch
    `sum_duplicate_sparse_gradient_rows`): one device and N devices then train alike."""
    from keras_mgpu_plugins.backends.tensorflow.patches import optimizer as optimizer_patches
    from keras_mgpu_plugins.compat import _registry

    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and _registry.patch_one("sum_duplicate_sparse_gradient_rows"):
        optimizer_patches.mark_sums_duplicate_slices(optimizer)


def _synchronize_batchnorm(model: Any) -> None:
    """Sets Keras's `synchronized=True` on every BatchNormalization, then rebuilds the steps."""
    import keras

    from keras_mgpu_plugins import compat

    for layer in compat.all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.synchronized = True
    model.train_function = model.test_function = model.predict_function = None
