"""Helpers over Keras's functional-graph internals, for `kmp.parallelize(strategy="model_parallel")`.

Keras 3 on TensorFlow re-runs a functional graph without the device scopes its
layers were called under (DESIGN.md, "Model parallelism on the TensorFlow
backend"): placing each call node needs the graph's nodes and the hook that
runs them. Callers check `require("model_parallel_graph")` (the private use in
`compat._private_uses`, re-exported here) before using these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require

__all__ = [
    "call_has_training_arg", "call_index", "call_nodes", "compute_loss", "current_device",
    "graph_of", "hook_graph_run", "move_variable", "node_of", "require",
]


def graph_of(model: Any) -> Any:
    """The `Function` whose nodes a Sequential or functional model runs, else `None`."""
    import keras

    if isinstance(model, keras.Sequential):
        return getattr(model, "_functional", None)
    return model if hasattr(model, "_nodes_by_depth") and hasattr(model, "_run_through_graph") \
        else None


def call_nodes(graph: Any) -> list[Any]:
    """The graph's layer-call nodes in the order `_run_through_graph` runs them (no inputs)."""
    nodes = []
    for depth in sorted(graph._nodes_by_depth, reverse=True):
        nodes.extend(n for n in graph._nodes_by_depth[depth] if n.operation and not n.is_input)
    return nodes


def node_of(tensor: Any) -> Any:
    """The node that produced a symbolic tensor, or `None` for a concrete one."""
    history = getattr(tensor, "_keras_history", None)
    if history is None:
        return None
    return history.operation._inbound_nodes[history.node_index]


def current_device() -> str:
    """The device scope in effect now (eager), as TensorFlow spells it; '' for none."""
    require("eager_context")
    return resolve("eager context").context().device_name or ""


def call_index(node: Any) -> int:
    """Which call of its layer a node is, in the order the calls were made (0 first)."""
    return node.operation._inbound_nodes.index(node)


def hook_graph_run(graph: Any, make_operation_fn: Callable[[Any], Any]) -> None:
    """Makes `graph` run each node's operation through `make_operation_fn(operation_fn)`.

    `make_operation_fn` gets Keras's own `operation_fn` for this run and returns the
    replacement, which is called once per node in `call_nodes` order.
    """
    from keras_mgpu_plugins.compat import _registry

    _registry.apply_to("placed_graph_run", graph, make_operation_fn)


def set_graph_run(graph: Any, make_operation_fn: Callable[[Any], Any]) -> None:
    """The registered per-instance patch `placed_graph_run` (see `hook_graph_run`)."""
    original = graph._run_through_graph

    def run_through_graph(inputs: Any, operation_fn: Any = lambda op: op, call_fn: Any = None):
        return original(inputs, operation_fn=make_operation_fn(operation_fn), call_fn=call_fn)

    graph._run_through_graph = run_through_graph


def move_variable(variable: Any, device: str) -> None:
    """Re-creates a Keras variable's `tf.Variable` on `device`: same name, path and value."""
    import tensorflow as tf

    old = variable._value
    if old is None:  # not yet initialised: it will be created where its layer builds
        return
    here, there = tf.DeviceSpec.from_string(old.device), tf.DeviceSpec.from_string(device)
    if (here.device_type, here.device_index) == (there.device_type, there.device_index):
        return
    with tf.device(device):
        variable._value = tf.Variable(
            old.read_value(), dtype=old.dtype, trainable=old.trainable,
            name=old.name.rsplit(":", 1)[0],
            aggregation=old.aggregation, synchronization=old.synchronization,
        )


def compute_loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """Keras's training loss for one (micro-)batch, tracked in the 'loss' metric as fit does."""
    import keras
    import tensorflow as tf

    loss_module = resolve("loss module")
    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=True)
    rows = tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0]
    model._loss_tracker.update_state(loss_module.unscale_loss_for_distribution(loss),
                                     sample_weight=rows)
    return loss


def call_has_training_arg(model: Any) -> bool:
    return bool(getattr(model, "_call_has_training_arg", True))
