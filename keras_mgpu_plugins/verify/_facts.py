"""What kmp can see in a model that makes N devices train otherwise than one device.

`of(model)` describes, as plain values, the things the report's likely causes are drawn
from (`_causes`): BatchNormalization layers and whether they are synchronized, a custom
`train_step`, the losses and their reduction, embeddings, the compiled metrics, the
layers that draw random numbers, `steps_per_execution`, mixed precision. Read at the first
fit's start, after `@kmp.parallelize` made the model.
"""

from __future__ import annotations

from typing import Any


def _own(model_or_layer: Any, method: str) -> str | None:
    """The qualified name of a `method` the model's class defines outside Keras, or `None`."""
    function = getattr(type(model_or_layer), method, None)
    module = getattr(function, "__module__", "") or ""
    if function is None or module.startswith("keras.") or module.startswith("keras_hub."):
        return None
    return f"{module}.{getattr(function, '__qualname__', method)}"


def _describe(leaf: Any) -> dict[str, Any]:
    if isinstance(leaf, str):
        return {"name": leaf, "module": "keras", "reduction": "sum_over_batch_size"}
    kind = leaf if isinstance(leaf, type) or callable(leaf) and not hasattr(
        leaf, "reduction") else type(leaf)
    return {"name": getattr(leaf, "name", None) or getattr(kind, "__name__", repr(leaf)),
            "module": getattr(kind, "__module__", "") or "",
            "reduction": getattr(leaf, "reduction", None)}


def of(model: Any) -> dict[str, Any]:
    """The facts the likely causes are drawn from, as plain values."""
    import keras

    from keras_mgpu_plugins import compat, runtime

    layers = compat.all_layers(model)
    optimizer = getattr(model, "optimizer", None)
    losses = [_describe(leaf) for leaf in keras.tree.flatten(getattr(model, "loss", None))
              if leaf is not None]
    metrics = []
    for metric in getattr(model, "metrics", []):
        for inner in getattr(metric, "metrics", None) or [metric]:  # CompileMetrics
            metrics.append({"name": inner.name, "module": type(inner).__module__ or "",
                            "class": type(inner).__name__})
    policy = getattr(getattr(model, "dtype_policy", None), "name", "float32")
    from keras_mgpu_plugins import _random_layers

    drawing = _random_layers.random_layers(model)
    as_one_device = bool(drawing) and all(
        _random_layers.draws_as_one_device(layer) for layer in layers
        if layer.name in {entry["layer"] for entry in drawing})
    return {
        "batchnorm": [{"layer": layer.name, "synchronized": bool(getattr(layer, "synchronized",
                                                                         False))}
                      for layer in layers if isinstance(layer, keras.layers.BatchNormalization)],
        "train_step": _own(model, "train_step"),
        "losses": losses,
        "embeddings": [layer.name for layer in layers
                       if isinstance(layer, keras.layers.Embedding)],
        "metrics": metrics,
        "random_layers": drawing,
        "random_layers_as_one_device": as_one_device,
        "steps_per_execution": int(getattr(model, "steps_per_execution", 1) or 1),
        "loss_scale": type(optimizer).__name__ == "LossScaleOptimizer",
        "dtype_policy": policy,
        "replicas": int(runtime.of(model).replicas_in_sync),
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
    }
