"""What kmp's torch data parallelism does around a model's steps: the processes start from
rank 0's state, and each optimizer averages the processes' gradients (`gradients`)."""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.backends.torch import collectives


def optimizers_of(model: Any) -> list:
    """The model's optimizer, and any other optimizer held as its attribute (a GAN's)."""
    import keras

    found = [model.optimizer] if getattr(model, "optimizer", None) is not None else []
    for value in list(vars(model).values()):
        if isinstance(value, keras.optimizers.Optimizer) and all(value is not f for f in found):
            found.append(value)
    return found


def broadcast_state(model: Any) -> None:
    """Every process := rank 0's model variables and its optimizers' (one collective per dtype:
    the initial weights, as DDP broadcasts them when it wraps a model)."""
    if collectives.world()[1] == 1:
        return
    variables = list(model.variables)
    for optimizer in optimizers_of(model):
        variables += list(optimizer.variables)
    seen, tensors = set(), []
    for variable in variables:
        if id(variable) not in seen:
            seen.add(id(variable))
            tensors.append(variable.value)
    collectives.broadcast_(tensors)


def average_gradients_of(model: Any) -> None:
    """Each optimizer of `model` averages the processes' gradients (`torch_gradients_averaged`,
    once per optimizer)."""
    from keras_mgpu_plugins.compat import applied_on, apply_to

    for optimizer in optimizers_of(model):
        if "torch_gradients_averaged" not in applied_on(optimizer):
            apply_to("torch_gradients_averaged", optimizer)
