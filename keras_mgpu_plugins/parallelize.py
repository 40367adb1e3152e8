"""`@parallelize`: run a model factory under the right `tf.distribute` strategy."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

from keras_mgpu_plugins import strategy as _strategy
from keras_mgpu_plugins.topology import topology

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
) -> Callable[[F], F]: ...


def parallelize(
    factory: Callable[..., Any] | None = None,
    *,
    strategy: Any = "auto",
    devices: Sequence[str] | Mapping[str, str] | None = None,
    require_compiled: bool = True,
    micro_batches: int | None = None,
    sync_batchnorm: bool = False,
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
            `tf.distribute.Strategy` instance. One strategy per process: every
            factory decorated with the same choice shares it. A
            `MultiWorkerMirroredStrategy` of your own gets the Keras fixes of
            `kmp.compat.patch_keras()` too.
        devices: For `"mirrored"`: the devices to replicate on. For
            `"model_parallel"` and `"hybrid"`: the stage devices in order (default: every local GPU,
            else every local CPU device), or a mapping from layer-name patterns to devices.
        require_compiled: Raise if the factory returns an uncompiled model
            under a distributing strategy (its optimizer must be created in
            the scope).
        micro_batches: For `"model_parallel"` and `"hybrid"`: split each batch into this many pieces
            in `fit` so stages work on different pieces at once (must divide the batch).
        sync_batchnorm: Make every `BatchNormalization` in the model compute
            its batch statistics over the global batch (all replicas and
            workers: Keras's `synchronized=True`), so several devices train
            as one device on the global batch. Default `False`: Keras's
            per-replica statistics (each replica normalises its own share).

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
        _strategy.check_instance(strategy, devices)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            active = _strategy.get_strategy(strategy, devices)
            _patch_if_distributing(active)
            with active.scope():
                model = fn(*args, **kwargs)
            _check_model(fn, model, active, require_compiled)
            _sum_duplicate_slices(model)
            if sync_batchnorm:
                _synchronize_batchnorm(model)
            return model

        wrapper.strategy = lambda: _strategy.get_strategy(strategy, devices)  # type: ignore[attr-defined]
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
    distributing = active is not tf.distribute.get_strategy() or active.num_replicas_in_sync > 1
    if require_compiled and distributing and not getattr(model, "compiled", False):
        raise ValueError(
            f"The factory {name} returned an uncompiled model. Call model.compile(...) "
            "inside the factory, so its optimizer is created under the strategy's scope "
            "(compiling outside fails in fit with 'Mixing different tf.distribute.Strategy "
            "objects'), or pass @parallelize(require_compiled=False) and compile inside "
            "`with model.distribute_strategy.scope():`."
        )


def _model_parallel(factory: Callable[..., Any] | None, devices: Any, micro_batches: Any) -> Any:
    """`@parallelize(strategy="model_parallel")`: see `keras_mgpu_plugins.model_parallel`."""
    from keras_mgpu_plugins.model_parallel import factory as build

    build.check_arguments(devices, micro_batches, topology().num_workers)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return build.build(fn, args, kwargs, devices, micro_batches)

        wrapper.strategy = lambda: _strategy.get_strategy("default", None)  # type: ignore[attr-defined]
        return wrapper

    return decorate(factory) if factory is not None else decorate


def _hybrid(factory: Callable[..., Any] | None, devices: Any, micro_batches: Any) -> Any:
    """`@parallelize(strategy="hybrid")`: see `keras_mgpu_plugins.model_parallel.hybrid`."""
    from keras_mgpu_plugins.model_parallel import factory as build
    from keras_mgpu_plugins.model_parallel import hybrid

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
