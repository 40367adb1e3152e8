"""`build()`: the factory of `@parallelize(strategy="model_parallel")`, placed."""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins import compat
from keras_mgpu_plugins.backends.tensorflow.model_parallel import devices as _devices
from keras_mgpu_plugins.backends.tensorflow.model_parallel import pipeline, placement
from keras_mgpu_plugins.model_parallel import plans
from keras_mgpu_plugins.model_parallel.report import placement_report


def check_arguments(devices: Any, micro_batches: Any, num_workers: int) -> None:
    """Refuses what model parallelism cannot do, before the factory runs.

    Raises:
        ValueError: For several workers, or `micro_batches` that is not a positive integer.
    """
    if num_workers > 1:
        raise ValueError(
            f"strategy='model_parallel' runs in one process on one machine; this job has "
            f"{num_workers} workers. For data parallel across workers with the model split "
            "over each worker's devices, use strategy='hybrid' (or launch one worker)."
        )
    if micro_batches is not None and (
            not isinstance(micro_batches, int) or isinstance(micro_batches, bool)
            or micro_batches < 1):
        raise ValueError(
            f"micro_batches must be a positive integer (or None for 1). Received: "
            f"micro_batches={micro_batches!r}"
        )


def build(fn: Callable[..., Any], args: tuple, kwargs: dict, devices: Any,
          micro_batches: int | None, scope: Callable[[], Any] | None = None,
          check_plan: Callable[[placement.Plan], None] | None = None) -> Any:
    """Runs the factory, places its model and returns it.

    Args:
        fn: The model factory.
        args: Its positional arguments.
        kwargs: Its keyword arguments.
        devices: `None` (every local GPU, else every local CPU device), a list of
            devices (stages, in order), or a mapping from layer-name patterns to devices.
        micro_batches: Pieces per global batch in `fit` (`None`: 1).
        scope: Makes the context the factory runs and the variables move in
            (`"hybrid"`: its strategy's scope, `tf.device` honoured).
        check_plan: Called with the plan before any variable moves (`"hybrid"`: every
            worker's plan must be the same).

    Returns:
        The model, its calls placed and its train step replaced by the placed one (a
        model whose class overrides `train_step` keeps its own).
    """
    import keras

    name = getattr(fn, "__qualname__", repr(fn))
    with (scope or contextlib.nullcontext)():
        staging = None if scope is not None else placement.staging_device()  # "hybrid": its own
        with placement.recording(staging) as scopes:
            model = fn(*args, **kwargs)
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"The factory {name} decorated with @parallelize must return a keras.Model. "
                f"Received: an object of type {type(model).__name__}"
            )
        pipeline.check_train_step(model, micro_batches or 1, name)
        plan = placement.plan(model, scopes, devices, micro_batches or 1, name)
        if check_plan is not None:
            check_plan(plan)
        placement.apply(model, plan, staging)
    _after_compile(model)
    compat.apply_to("placed_compile_keeps_placement", model)
    loss_device = plan.calls[-1].device if plan.calls and not plan.subclassed else None
    pipeline.install_train_step(model, micro_batches or 1, loss_device)
    for attribute in ("train_function", "test_function", "predict_function"):
        setattr(model, attribute, None)  # traced before placement: trace again
    plans.record(model, plans.Placed(plan, _devices.canonical))
    compat.apply_to("placement_report_on_first_fit", model)
    compat.apply("placed_model_clone_warning")
    return model


class PlacementNotClonedWarning(UserWarning):
    """`keras.models.clone_model` of a placed model returned an unplaced model."""


def wrap_clone_model() -> Any:
    """Makes `keras.models.clone_model` warn when given a model kmp placed; returns the undo.

    The registered patch `placed_model_clone_warning`. Keras clones a model from
    its config: new layers, new variables, none of the calls' device placement,
    micro-batches or placed train step. The clone is a plain one-device model
    (what an export or an inference copy may want), so it is returned, with a
    `PlacementNotClonedWarning` saying so (`warnings.filterwarnings("error",
    category=...)` makes it an error).
    """
    import keras

    original = keras.models.clone_model

    @functools.wraps(original)
    def clone_model(model: Any, *args: Any, **kwargs: Any) -> Any:
        if plans.of(model) is not None:
            warnings.warn(
                f"keras.models.clone_model({model.name!r}) returns an unplaced model: "
                "the model was placed over several devices by @kmp.parallelize("
                "strategy='model_parallel' or 'hybrid'), and Keras clones layers from their "
                "config, without their devices, micro-batches or placed train step; the "
                "clone runs where TensorFlow puts it (one device). For a placed copy, call "
                "the decorated factory again and copy the weights "
                "(copy.set_weights(model.get_weights())).",
                PlacementNotClonedWarning, stacklevel=2)
        return original(model, *args, **kwargs)

    return compat.replace(keras.models, "clone_model", clone_model)


def _after_compile(model: Any) -> None:
    """What a compile must be followed by: slots beside their variable, no XLA."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and "placed_optimizer_slots" not in compat.applied_on(optimizer):
        compat.apply_to("placed_optimizer_slots", optimizer)
    if getattr(model, "compiled", False):
        model.jit_compile = False  # one XLA cluster would run on one device


def wrap_compile(model: Any) -> None:
    """A model compiled again (or first) after the factory keeps slots placed and XLA off.

    The registered per-instance patch `placed_compile_keeps_placement`."""
    original = model.compile

    def compile(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _after_compile(model)
        return result

    model.compile = compile


def wrap_slot_creation(optimizer: Any) -> None:
    """Makes `optimizer` create each slot variable on its parameter's device.

    The registered per-instance patch `placed_optimizer_slots`."""
    import tensorflow as tf

    original = optimizer.add_variable_from_reference

    def add_variable_from_reference(reference_variable: Any, *args: Any, **kwargs: Any) -> Any:
        device = getattr(getattr(reference_variable, "value", reference_variable), "device", "")
        with tf.device(device or None):
            return original(reference_variable, *args, **kwargs)

    optimizer.add_variable_from_reference = add_variable_from_reference


def wrap_fit_with_report(model: Any) -> None:
    """Prints the placement report once, before the first `fit` whose `verbose` is not 0
    (activations estimated for that `fit`'s `batch_size`, a worker's share under "hybrid",
    when it gives one). Under "hybrid" only the chief prints it (every worker's plan is
    the same: `hybrid._same_plan`), unless `KMP_OUTPUT=all`. The registered per-instance
    patch `placement_report_on_first_fit`."""
    original = model.fit
    printed = [False]

    def fit(*args: Any, **kwargs: Any) -> Any:
        verbose = args[4] if len(args) > 4 else kwargs.get("verbose", "auto")
        placed = plans.of(model)
        workers, index = placed.workers, placed.worker_index  # "hybrid": each worker's share
        shown = index == 0 or os.environ.get("KMP_OUTPUT") == "all"
        if not printed[0] and verbose != 0 and shown:
            printed[0] = True
            batch_size = args[2] if len(args) > 2 else kwargs.get("batch_size")
            print(placement_report(model, batch_size=batch_size and batch_size // workers),
                  flush=True)
        return original(*args, **kwargs)

    model.fit = fit
