"""FLOPs of a training step on TensorFlow: the graph profiler's count of its forward and backward pass.

`run_and_count` runs the step `fit` asked for and reads the shapes of its batch from the
iterator Keras hands the train function (`element_spec`: one replica's part under a
strategy), then traces the model's forward pass and its gradient at those shapes in a
`tf.function` (traced, never run) and counts the floating-point operations of the ops its
outputs need with TensorFlow's profiler (`tf.compat.v1.profiler`, `float_operation()`):
matrix products and convolutions at 2 FLOPs per multiply-add (a convolution's gradients as
many as its forward product), elementwise ops at one. The optimizer's update is
not part of it. The profiler does not look inside a loop (`tf.while_loop`, an RNN): such a
step is reported as not counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins._flop_count import FlopCount, guarded, per_sample, tokens_per_sample

METHOD = "TensorFlow's graph profiler on the forward and backward pass"
_LOOPS = {"While", "StatelessWhile", "For"}


def run_and_count(model: Any, original: Callable[..., Any], args: tuple) -> tuple[Any, FlopCount]:
    """`original(*args)` (Keras's `train_function(iterator)`), and the FLOPs of its step."""
    spec = getattr(args[0], "element_spec", None) if args else None
    result = original(*args)
    if spec is None:
        return result, FlopCount.absent("the step's input has no element_spec")
    return result, guarded(count, model, spec)


def count(model: Any, spec: Any, default_rows: int = 8) -> FlopCount:
    """The forward and backward pass's FLOPs per row at the shapes of `spec` (one batch's
    `TensorSpec`s; one replica's where they are per replica; `default_rows` rows where the
    batch dimension is unknown)."""
    import keras
    import tensorflow as tf

    x, _, _ = keras.utils.unpack_x_y_sample_weight(_one_replica(spec))
    leaves = tf.nest.flatten(x)
    rows = leaves[0].shape[0] if leaves and leaves[0].shape.rank else None
    rows = int(rows) if rows is not None else default_rows
    x = tf.nest.map_structure(lambda s: tf.TensorSpec([rows, *s.shape[1:]], s.dtype), x)
    tokens = tokens_per_sample((tuple(s.shape), s.dtype.name) for s in tf.nest.flatten(x))
    if not model.trainable_variables:
        return FlopCount.absent("the model has no trainable weights", tokens, rows)

    graph = None
    for training in (True, False):  # training=False where a layer cannot be traced training
        try:                         # outside the strategy's replica context
            graph = _traced(model, x, training)
            break
        except Exception as err:  # noqa: BLE001 - said below if neither traces
            error = err
    if graph is None:
        return FlopCount.absent(f"the forward pass could not be traced ({type(error).__name__}: "
                                 f"{error})", tokens, rows)
    if any(op.type in _LOOPS for op in graph.get_operations()):
        return FlopCount.absent("the step holds a loop (tf.while_loop, an RNN), inside which "
                                 "TensorFlow's profiler does not count", tokens, rows)
    return per_sample(_profile(graph), rows, METHOD, tokens)


def _traced(model: Any, x: Any, training: bool) -> Any:
    """The graph of the forward pass and its gradient (of the sum of the outputs: the
    profiler counts the graph as written, so the backward pass keeps every product)."""
    import tensorflow as tf

    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            outputs = [o for o in tf.nest.flatten(model(x, training=training))
                       if o.dtype.is_floating]
            total = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in outputs])
        return total, tape.gradient(total, model.trainable_variables)

    return tf.function(step).get_concrete_function(x).graph


def _one_replica(spec: Any) -> Any:
    """The spec of one replica's batch (a `PerReplicaSpec` holds one per replica)."""
    import tensorflow as tf

    def first(s: Any) -> Any:
        return s if isinstance(s, tf.TensorSpec) else tf.nest.flatten(s, expand_composites=True)[0]

    return tf.nest.map_structure(first, spec)


def _profile(graph: Any) -> float:
    """The FLOPs of the ops the graph's outputs need, by TensorFlow's profiler (per op, so a
    gradient nobody asked for, which TensorFlow prunes when it runs, is not counted), with
    the convolutions' gradients counted exactly (`_conv_backprop`)."""
    import tensorflow as tf

    profiler = tf.compat.v1.profiler
    options = profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    quiet = logging.getLogger("tensorflow")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # a deprecation notice of the profiler's own, once per call
    try:
        tree = profiler.profile(graph, cmd="scope", options=options)
    finally:
        quiet.setLevel(level)
    counted: dict[str, float] = {}
    todo = [tree]
    while todo:
        node = todo.pop()
        counted[node.name] = float(node.float_ops)
        todo.extend(node.children)
    total = 0.0
    for op in _live(graph):
        exact = _conv_backprop(op)
        total += exact if exact is not None else counted.get(op.name, 0.0)
    return total


def _live(graph: Any) -> list:
    """The ops the graph's outputs depend on."""
    seen: dict[str, Any] = {}
    todo = [t.op for t in graph.outputs]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen[op.name] = op
            todo.extend(i.op for i in op.inputs)
            todo.extend(op.control_inputs)
    return list(seen.values())


def _conv_backprop(op: Any) -> float | None:
    """A 2-D convolution's gradient: as many multiply-adds as its forward product (the
    profiler's formula takes the input's size for the output's, too many without padding)."""
    if op.type == "Conv2DBackpropInput":
        kernel, grad = op.inputs[1].shape, op.inputs[2].shape
    elif op.type == "Conv2DBackpropFilter":
        kernel, grad = op.outputs[0].shape, op.inputs[2].shape
    else:
        return None
    if not (kernel.is_fully_defined() and grad.is_fully_defined()):
        return None
    return 2.0 * grad.num_elements() * kernel[0] * kernel[1] * kernel[2]


def compute_devices() -> list[str]:
    """What each of this process's devices is: a GPU's name, `"cpu"` for each CPU device."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    logical = tf.config.list_logical_devices("GPU")
    if logical:
        names = [tf.config.experimental.get_device_details(g).get("device_name", "GPU")
                 for g in gpus] or ["GPU"]
        return [names[min(i, len(names) - 1)] for i in range(len(logical))]
    return ["cpu"] * max(1, len(tf.config.list_logical_devices("CPU")))


def float32_on_tensor_cores() -> bool:
    """Whether float32 matmuls use TF32 on GPUs (TensorFlow's default since 2.4)."""
    import tensorflow as tf

    return bool(tf.config.experimental.tensor_float_32_execution_enabled())
