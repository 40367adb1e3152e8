"""Memory estimates per layer call: parameters, optimizer slots, activations, transfers."""

from __future__ import annotations

import math
from typing import Any

#: Batch size assumed for activation estimates when the model's input has no fixed batch.
NOMINAL_BATCH = 32

#: Optimizer slot variables per parameter, by optimizer class (Keras's built-in ones).
_SLOTS = {"Adam": 2, "AdamW": 2, "Adamax": 2, "Nadam": 2, "Adadelta": 2, "Ftrl": 2, "Lamb": 2,
          "Adagrad": 1, "Lion": 1, "RMSprop": 1, "Muon": 2, "Adafactor": 1, "LossScaleOptimizer": 2}


def slots_per_parameter(optimizer: Any) -> int:
    """How many slot variables the optimizer keeps per parameter (2 when unknown)."""
    if optimizer is None:
        return 0
    known = known_slots(optimizer)
    return 2 if known is None else known


def known_slots(optimizer: Any) -> int | None:
    """Slot variables per parameter of a Keras built-in optimizer class, `None` for another."""
    name = type(optimizer).__name__
    if name == "SGD":
        return 1 if float(getattr(optimizer, "momentum", 0.0) or 0.0) else 0
    if name == "RMSprop":
        return 1 + bool(getattr(optimizer, "centered", False)) + bool(
            float(getattr(optimizer, "momentum", 0.0) or 0.0))
    return _SLOTS.get(name)


def tensor_bytes(tensor: Any, batch: int) -> int:
    """Bytes of a symbolic tensor with its unknown (batch) dimensions set to `batch`."""
    shape = getattr(tensor, "shape", None)
    if shape is None:
        return 0
    dims = [batch if d is None else int(d) for d in shape]
    size = _dtype_size(getattr(tensor, "dtype", "float32"))
    return int(math.prod(dims)) * size if dims else size


def _dtype_size(dtype: Any) -> int:
    import numpy as np

    try:
        return int(np.dtype(str(getattr(dtype, "name", dtype))).itemsize)
    except TypeError:
        return 4


class Estimator:
    """Bytes each call needs: its layer's parameters (first call only) and slots, activations."""

    def __init__(self, model: Any) -> None:
        self.slots = slots_per_parameter(getattr(model, "optimizer", None))
        inputs = getattr(model, "inputs", None) or []
        fixed = [t.shape[0] for t in inputs if getattr(t, "shape", None) and t.shape[0]]
        self.batch = int(fixed[0]) if fixed else NOMINAL_BATCH
        self._counted: set[int] = set()

    def parameter_bytes(self, layer: Any) -> int:
        return sum(self.parameter_bytes_of(v) for v in layer.weights)

    @staticmethod
    def parameter_bytes_of(variable: Any) -> int:
        return int(math.prod(variable.shape)) * _dtype_size(variable.dtype)

    def activation_bytes(self, node: Any) -> int:
        if node is None:
            return 0
        return sum(tensor_bytes(t, self.batch) for t in node.outputs)

    def call_bytes(self, call: Any) -> float:
        """What balancing weighs: parameters and slots (once per layer) plus activations."""
        params = 0
        if id(call.layer) not in self._counted:
            self._counted.add(id(call.layer))
            params = self.parameter_bytes(call.layer) * (1 + self.slots)
        return float(params + self.activation_bytes(call.node))
