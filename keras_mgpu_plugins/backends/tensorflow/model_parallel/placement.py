"""Record where each layer call was asked to run, plan the rest, and make it stick in `fit`.

Three sources of a call node's device, in this order:

1. the `tf.device` / `keras.device` scope in effect when the factory called the layer
   (recorded by `recording()`, which wraps `keras.layers.Layer.__call__` while the factory
   runs and reads TensorFlow's current device; a call without a scope builds its variables
   on the staging device, the host when there are GPUs);
2. `devices` given as a mapping: the first layer-name pattern (`fnmatch`) matching the layer;
3. automatic: when no call was placed by 1 or 2, all calls, in execution order, split into
   contiguous stages over the devices, balanced by the memory each needs
   (`balance.split_contiguous` over `costs`); when some were, each remaining call runs where
   its first input was made (the model's inputs: the first device), adding no transfer.

`apply()` then (a) re-creates each layer's variables on the device of its first call (same
names and paths: checkpoints do not change), (b) makes the model's graph run every node under
its device (the hook in `patches.functional_graph.hook_graph_run`), and (c) for subclassed models, wraps
the matched layers' own `call` and `build` in their device scope.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from keras_mgpu_plugins import compat
from keras_mgpu_plugins.backends.tensorflow.local_devices import logical_devices
from keras_mgpu_plugins.backends.tensorflow.model_parallel import devices as _devices
from keras_mgpu_plugins.backends.tensorflow.patches import functional_graph as private
from keras_mgpu_plugins.model_parallel import costs as _costs
from keras_mgpu_plugins.model_parallel.balance import split_contiguous


@dataclasses.dataclass
class Call:
    """One layer call of the model and where it runs.

    Attributes:
        node: The Keras call node (`None` for a subclassed model's layer).
        layer: The layer (or nested model) called.
        label: `layer.name`, with `#k` for the k-th call (as made) of a shared layer.
        device: Canonical device name.
        how: `"scope"` (tf.device in the factory), `"pattern"` (devices mapping), `"auto"`.
    """

    node: Any
    layer: Any
    label: str
    device: str
    how: str


@dataclasses.dataclass
class Plan:
    """Where a placed model runs: its calls in execution order, its stage devices."""

    calls: list[Call]
    devices: list[str]
    micro_batches: int
    subclassed: bool = False


def staging_device() -> str | None:
    """Where a layer called without a scope builds its variables while the factory runs:
    the host (`/device:CPU:0`) when this process has GPUs, so no GPU ever holds the whole
    model; `None` (TensorFlow's default device) without GPUs."""
    return "/device:CPU:0" if logical_devices("GPU") else None


#: The recordings in progress, innermost last: (staging device, what it records into).
_RECORDING: list[tuple[str | None, dict[int, str]]] = []


@contextlib.contextmanager
def recording(staging: str | None = None) -> Iterator[dict[int, str]]:
    """Within: every layer call's device scope, keyed by `id(node)` of the node it made.

    Applies the registered patch `placement_records_layer_calls` (a wrap of
    `keras.layers.Layer.__call__`) for the outermost recording, and removes it after.

    Args:
        staging: A device for the calls made without a scope: the variables they build
            are created there (and moved to their stage by `apply`); `None`: no scope.
    """
    seen: dict[int, str] = {}
    _RECORDING.append((staging, seen))
    try:
        compat.apply("placement_records_layer_calls")
        yield seen
    finally:
        _RECORDING.pop()
        if not _RECORDING:
            compat.remove("placement_records_layer_calls")


def wrap_layer_call() -> Any:
    """The patch itself: wraps `keras.layers.Layer.__call__`; returns the undo."""
    import keras
    import tensorflow as tf

    original = keras.layers.Layer.__call__

    @functools.wraps(original)
    def recording_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _RECORDING:
            return original(self, *args, **kwargs)
        staging, seen = _RECORDING[-1]
        device = private.current_device()
        with tf.device(staging) if staging and not device else contextlib.nullcontext():
            outputs = original(self, *args, **kwargs)
        for tensor in keras.tree.flatten(outputs):
            node = private.node_of(tensor)
            if node is not None and node.operation is self:
                seen.setdefault(id(node), device)
        return outputs

    return compat.replace(keras.layers.Layer, "__call__", recording_call)


def plan(model: Any, scopes: dict[int, str], devices: Any, micro_batches: int,
         factory_name: str) -> Plan:
    """Every call's device: recorded scope, then pattern, then automatic stages."""
    import keras

    private.require("model_parallel_graph")
    mapping = dict(devices) if isinstance(devices, Mapping) else None
    graph = private.graph_of(model)
    if graph is None and isinstance(model, keras.Sequential):
        raise ValueError(
            f"The factory {factory_name} returned a Sequential model without a graph yet: start "
            "it with keras.Input(shape), so its layers are called (and placed) in the factory."
        )
    if graph is None:
        return _plan_subclassed(model, mapping, micro_batches)
    nodes = private.call_nodes(graph)
    if not any(id(node) in scopes for node in nodes):
        raise ValueError(
            f"The factory {factory_name} returned a model whose layers were not called inside "
            "it: model_parallel records each layer call's device while the factory runs, so "
            "build the model (create and call its layers) inside the decorated factory."
        )
    stage_devices = (_devices.resolve(list(dict.fromkeys(mapping.values()))) if mapping
                     else _devices.resolve(devices))
    calls = []
    for node in nodes:
        layer, index = node.operation, private.call_index(node)
        label = layer.name if index == 0 else f"{layer.name}#{index + 1}"
        scope, how = scopes.get(id(node), ""), "scope"
        if scope:
            device = _devices.canonical(scope, f"tf.device scope around {label!r}")
        elif mapping and (device := _match(layer.name, mapping)) is not None:
            device, how = _devices.canonical(device, "devices"), "pattern"
        else:
            device, how = "", "auto"
        calls.append(Call(node, layer, label, device, how))
    if mapping:
        _check_patterns(mapping, [c.layer.name for c in calls])
    auto = [c for c in calls if c.how == "auto"]
    if auto and len(auto) == len(calls):
        estimate = _costs.Estimator(model)
        stages = split_contiguous([estimate.call_bytes(c) for c in auto], len(stage_devices))
        for call, stage in zip(auto, stages, strict=True):
            call.device = stage_devices[stage]
    elif auto:
        _follow_producers(calls, stage_devices[0])
    return Plan(calls, list(dict.fromkeys(c.device for c in calls)), micro_batches)


def _follow_producers(calls: list[Call], default: str) -> None:
    """Mixed placement: an unplaced call runs where its first input was made (no new hop)."""
    where = {id(c.node): c.device for c in calls if c.how != "auto"}
    for call in calls:
        if call.how == "auto":
            inputs = [private.node_of(t) for t in call.node.input_tensors]
            made = [where.get(id(n)) for n in inputs if n is not None]
            call.device = next((d for d in made if d), default)
            where[id(call.node)] = call.device


def _match(name: str, mapping: Mapping[str, str]) -> str | None:
    for pattern, device in mapping.items():
        if fnmatch.fnmatchcase(name, pattern):
            return device
    return None


def _check_patterns(mapping: Mapping[str, str], names: Sequence[str]) -> None:
    for pattern in mapping:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise ValueError(
                f"devices: the layer-name pattern {pattern!r} matches no layer. The model's "
                f"layers: {sorted(set(names))}"
            )


def _plan_subclassed(model: Any, mapping: dict[str, str] | None, micro_batches: int) -> Plan:
    if mapping is None:
        raise ValueError(
            f"Automatic placement needs a Sequential or functional model (their call order is "
            f"known); {type(model).__name__} is a subclassed model. Pass devices as a mapping "
            "from layer-name patterns to devices, e.g. devices={'encoder*': '/gpu:0', "
            "'head': '/gpu:1'}, or use tf.device inside your model's own call."
        )
    layers = list(model.layers)
    _check_patterns(mapping, [layer.name for layer in layers])
    calls = []
    for layer in layers:
        device = _match(layer.name, mapping)
        if device is not None:
            calls.append(Call(None, layer, layer.name, _devices.canonical(device), "pattern"))
    return Plan(calls, list(dict.fromkeys(c.device for c in calls)), micro_batches,
                subclassed=True)


def apply(model: Any, placement: Plan, staging: str | None = None) -> None:
    """Puts variables on their devices and makes every call run under its device.

    Args:
        model: The factory's model.
        placement: Its plan.
        staging: The device `recording` built unscoped variables on: a variable still
            there that no call places (a subclassed model's unmatched layers) moves to
            the first local device, where TensorFlow would have created it.
    """
    import tensorflow as tf

    first: dict[int, Call] = {}  # a layer's variables live where its first call (as made) runs
    for call in sorted(placement.calls, key=lambda c: 0 if c.node is None else
                       private.call_index(c.node)):
        first.setdefault(id(call.layer), call)
    placed = set()
    for call in first.values():
        for variable in call.layer.variables:
            private.move_variable(variable, call.device)
            placed.add(id(variable))
    if staging:
        for variable in model.variables:
            value = getattr(variable, "_value", None)
            if (id(variable) not in placed and value is not None
                    and _devices.canonical(value.device) == staging):
                private.move_variable(variable, _devices.local_devices()[0])
    if placement.subclassed:
        for call in placement.calls:
            compat.apply_to("placed_layer_call", call.layer, call.device)
        return
    by_node = [(c.layer, c.device) for c in placement.calls]

    def make_operation_fn(operation_fn: Any) -> Any:
        cursor = [0]

        def placed(operation: Any) -> Any:
            i = cursor[0]
            while i < len(by_node) and by_node[i][0] is not operation:
                i += 1  # a node Keras skipped (not computable from these inputs)
            if i == len(by_node):
                raise RuntimeError(
                    f"model_parallel: Keras ran layer {getattr(operation, 'name', operation)!r} "
                    "in an order placement did not record; please report it with your model."
                )
            cursor[0] = i + 1
            inner, device = operation_fn(operation), by_node[i][1]

            def call(*args: Any, **kwargs: Any) -> Any:
                with tf.device(device):
                    return inner(*args, **kwargs)

            return call

        return placed

    private.hook_graph_run(private.graph_of(model), make_operation_fn)


def wrap_in_device(layer: Any, device: str) -> None:
    """Runs `layer`'s own `call` and `build` under `device` (the per-instance patch
    `placed_layer_call`)."""
    import tensorflow as tf

    for name in ("call", "build"):
        original = getattr(layer, name)

        def placed(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with tf.device(device):
                return _original(*args, **kwargs)

        functools.update_wrapper(placed, original)
        setattr(layer, name, placed)
