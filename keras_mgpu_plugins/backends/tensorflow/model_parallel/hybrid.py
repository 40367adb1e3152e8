"""`@parallelize(strategy="hybrid")`: data parallel across workers, the model split within each.

Each worker builds the model placed over its own devices exactly as `"model_parallel"`
does, inside the scope of a `MultiWorkerMirroredStrategy` that has one replica per worker
(`kmp.strategy.hybrid_strategy()`). Keras's `fit` then gives each worker its share of every
global batch and all-reduces the gradients across workers once per step with TensorFlow's
collectives; the placed train step (`pipeline`) keeps each stage's forward and backward
ops on the stage's device.

A strategy's scope creates every variable on the strategy's devices, ignoring `tf.device`.
`placing_scope` makes the requested device stick: a variable creator inside the scope notes
the device asked for, and one outside it (which the strategy's own creator calls to make
each component) creates the component there. The variables stay `MirroredVariable`s of the
strategy (one component each), so Keras's optimizer updates them as usual, on their device.
See docs/model_parallelism.md, "Hybrid parallelism", for why this design.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from keras_mgpu_plugins import compat
from keras_mgpu_plugins.backends.tensorflow.model_parallel import devices as _devices
from keras_mgpu_plugins.backends.tensorflow.model_parallel import factory
from keras_mgpu_plugins.backends.tensorflow.model_parallel.placement import Plan
from keras_mgpu_plugins.backends.tensorflow.patches import functional_graph as private
from keras_mgpu_plugins.backends.tensorflow.runtime import TensorFlowRuntime
from keras_mgpu_plugins.cluster.topology import topology
from keras_mgpu_plugins.model_parallel import plans


def prepare() -> Any:
    """At decoration: the hybrid strategy when the job has several workers (created now,
    before TensorFlow's runtime starts), else `None` (one worker: `"model_parallel"`)."""
    from keras_mgpu_plugins.backends.tensorflow import strategy as _strategy

    return _strategy.hybrid_strategy() if topology().is_multi_worker else None


def build(fn: Callable[..., Any], args: tuple, kwargs: dict, devices: Any,
          micro_batches: int | None) -> Any:
    """Runs the factory on every worker, places its model and checks the workers agree.

    Raises:
        ValueError: On every worker, if the workers have different numbers of local
            devices or place the model differently, or if the factory is called inside
            another strategy's scope.
    """
    import tensorflow as tf

    if tf.distribute.has_strategy():
        raise ValueError(
            "strategy='hybrid' builds the model under a strategy of its own (one replica per "
            "worker, the model placed over the worker's devices); this factory was called "
            f"inside the scope of a {type(tf.distribute.get_strategy()).__name__}. Call it "
            "outside any `strategy.scope()`."
        )
    strategy = prepare()
    if strategy is None:
        model = factory.build(fn, args, kwargs, devices, micro_batches)
    else:
        _same_device_count(strategy)
        model = factory.build(fn, args, kwargs, devices, micro_batches,
                              scope=lambda: placing_scope(strategy),
                              check_plan=lambda plan: _same_plan(plan, strategy))
        rank = TensorFlowRuntime(strategy).rank()
        plans.set_workers(model, rank.num_workers, rank.worker_index)
        compat.apply_to("hybrid_compile_in_strategy_scope", model, strategy)
    return model


def wrap_compile(model: Any, strategy: Any) -> None:
    """A compile after the factory creates its optimizer under the strategy too.

    The registered per-instance patch `hybrid_compile_in_strategy_scope`."""
    import tensorflow as tf

    original = model.compile

    def compile(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            if not tf.distribute.has_strategy():
                stack.enter_context(placing_scope(strategy))
            return original(*args, **kwargs)

    model.compile = compile


@contextlib.contextmanager
def placing_scope(strategy: Any) -> Iterator[None]:
    """`strategy.scope()` in which a variable is created where `tf.device` asks (eagerly)."""
    import tensorflow as tf

    requested: list[str] = []

    def outer(next_creator: Any, **kwargs: Any) -> Any:  # called by the strategy's creator
        device = requested[-1] if requested else ""
        if not device:
            return next_creator(**kwargs)
        with tf.device(device):
            return next_creator(**kwargs)

    def inner(next_creator: Any, **kwargs: Any) -> Any:  # called first: notes the request
        requested.append("" if tf.inside_function() else private.current_device())
        try:
            return next_creator(**kwargs)
        finally:
            requested.pop()

    # The strategy's scope sets its worker as the default device: cleared, so that a
    # layer's recorded scope is what the factory asked for (the worker is implied).
    with tf.variable_creator_scope(outer), strategy.scope(), tf.device(None), \
            tf.variable_creator_scope(inner):
        yield


def _same_device_count(strategy: Any) -> None:
    counts = TensorFlowRuntime(strategy).all_gather(np.array([len(_devices.local_devices())]))[:, 0]
    if len(set(counts.tolist())) > 1:
        listed = ", ".join(f"worker {i}: {int(n)}" for i, n in enumerate(counts))
        raise ValueError(
            "strategy='hybrid' splits the model the same way on every worker, so every worker "
            f"needs the same number of local devices. Local devices per worker: {listed}. "
            "Give every worker the same devices (CUDA_VISIBLE_DEVICES, kmp.simulate_devices)."
        )


def signature(plan: Plan) -> str:
    """One line per layer call: `label -> device` (what every worker must agree on)."""
    return "\n".join(f"{call.label} -> {call.device}" for call in plan.calls)


def _same_plan(plan: Plan, strategy: Any) -> None:
    """Raises on every worker, naming the first difference, if a worker placed otherwise."""
    runtime, text = TensorFlowRuntime(strategy), signature(plan)
    if not runtime.settings_differ({"placement": text}):
        return
    lines = [t.splitlines() for t in runtime.gather_texts(text)]
    first = next((i for i in range(max(map(len, lines)))
                  if len({tuple(x[i:i + 1]) for x in lines}) > 1), 0)
    where = "; ".join(f"worker {w}: {x[first] if first < len(x) else '(no such call)'}"
                      for w, x in enumerate(lines))
    raise ValueError(
        "strategy='hybrid' needs the same placement on every worker (each worker holds the "
        "whole model, and the gradients of a variable are averaged with its copies on the "
        f"other workers), but the workers placed the model differently. Call {first + 1}: "
        f"{where}. Make the factory's tf.device scopes and `devices` the same on every worker."
    )
