"""Before the first step: does a model sharded by `strategy="model_parallel"` / `"hybrid"` fit?

`check(model)` runs where the decorated factory returns the model (JAX lane). Per device
of this process it adds up what the model will hold there during training:

- its parameters as laid out: the bytes of each variable's `addressable_shards` on
  that device (measured, the arrays exist);
- the optimizer's slots: measured from the optimizer's variables if it is built; else
  estimated, each slot taking its parameter's layout (Keras gives a slot its reference
  variable's layout): slots per trainable variable from the optimizer's class
  (`model_parallel.costs.known_slots`: Adam/AdamW 2, SGD 0 or 1 with momentum, RMSprop
  1-3, ...; `amsgrad`, `use_ema` and `gradient_accumulation_steps` one more each; a
  `LossScaleOptimizer` counts its inner optimizer's). An optimizer class kmp does not
  know is not counted (the check then covers the parameters alone): estimating it wrong
  could refuse a model that fits.

and compares it with what the device can give: `memory_stats()["bytes_limit"]` less
the bytes in use by anything else (`bytes_in_use` less the model's own arrays already
there). Where the platform reports no memory (`memory_stats()` is `None`, JAX's CPU
devices), nothing is checked. Activations, gradients and XLA's temporaries come on top,
so passing the check does not promise the step fits; failing it means it cannot.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_mgpu_plugins.errors import ModelTooLargeError
from keras_mgpu_plugins.model_parallel import costs
from keras_mgpu_plugins.model_parallel.report import _size

#: Variables named per device in the error, largest first.
LARGEST = 3


def memory_stats(device: Any) -> dict[str, int] | None:
    """`device.memory_stats()`, or `None` where the platform reports no memory (CPU).

    The one place the check reads device memory (a test on CPU replaces it).
    """
    try:
        stats = device.memory_stats()
    except (NotImplementedError, RuntimeError):  # a plugin without memory statistics
        return None
    return dict(stats) if stats else None


@dataclasses.dataclass(frozen=True)
class DeviceNeed:
    """What one device must hold for training, and what it can give.

    Attributes:
        device: Keras's name of the device, e.g. `"gpu:1"`.
        parameter_bytes: Bytes of the model's variables it holds (measured).
        optimizer_bytes: Bytes of the optimizer's slots it will hold.
        optimizer_how: How those were counted, e.g. `"Adam, 2 slots per parameter,
            estimated"` or `"measured"`.
        limit_bytes: `memory_stats()["bytes_limit"]`.
        other_bytes: Bytes in use on it by arrays other than the model's.
        largest: `(variable, bytes on this device)`, the largest first.
    """

    device: str
    parameter_bytes: int
    optimizer_bytes: int
    optimizer_how: str
    limit_bytes: int
    other_bytes: int
    largest: tuple[tuple[str, int], ...]

    @property
    def needed_bytes(self) -> int:
        return self.parameter_bytes + self.optimizer_bytes

    @property
    def available_bytes(self) -> int:
        return self.limit_bytes - self.other_bytes

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.available_bytes


def _name(device: Any) -> str:
    return f"{device.platform}:{device.id}"


def held(variable: Any) -> dict[Any, int]:
    """Bytes of `variable` on each device of this process that holds a piece of it."""
    return {shard.device: int(shard.data.nbytes) for shard in variable.value.addressable_shards}


def slots_per_variable(optimizer: Any) -> tuple[int, str]:
    """Slot variables the optimizer will create per trainable variable, and how it is known."""
    if optimizer is None:
        return 0, "no optimizer (model not compiled): slots not counted"
    base = getattr(optimizer, "inner_optimizer", None) or optimizer  # LossScaleOptimizer
    name = type(base).__name__
    slots = costs.known_slots(base)
    if slots is None:
        return 0, f"{name}, an optimizer class kmp does not know: slots not counted"
    slots += sum(bool(getattr(base, a, None)) for a in
                 ("amsgrad", "use_ema", "gradient_accumulation_steps"))
    return slots, f"{name}, {slots} slot{'s' if slots != 1 else ''} per parameter, estimated"


def needs(model: Any) -> list[DeviceNeed]:
    """Per device of this process that reports its memory, what training `model` needs there."""
    params: dict[Any, int] = {}
    sizes: dict[Any, list[tuple[str, int]]] = {}
    for variable in model.weights:
        for device, size in held(variable).items():
            params[device] = params.get(device, 0) + size
            sizes.setdefault(device, []).append((variable.path, size))
    optimizer = getattr(model, "optimizer", None)
    opt: dict[Any, int] = dict.fromkeys(params, 0)
    if optimizer is not None and getattr(optimizer, "built", False):
        how, tracked = "measured", {id(v) for v in model.weights}
        for variable in optimizer.variables:
            if id(variable) not in tracked:
                for device, size in held(variable).items():
                    opt[device] = opt.get(device, 0) + size
    else:
        slots, how = slots_per_variable(optimizer)
        for variable in model.trainable_weights if slots else ():
            for device, size in held(variable).items():
                opt[device] += slots * size
    decisions = _decisions(model)
    found = []
    for device in params:
        stats = memory_stats(device)
        if not stats or "bytes_limit" not in stats:
            continue
        mine = params[device] + (opt[device] if how == "measured" else 0)  # allocated already
        largest = [(f"{path} ({decisions[path]})" if decisions.get(path, "").startswith(
            "replicated (no layout_map") else path, size)
            for path, size in sorted(sizes[device], key=lambda item: -item[1])[:LARGEST]]
        found.append(DeviceNeed(
            _name(device), params[device], opt[device], how, int(stats["bytes_limit"]),
            max(0, int(stats.get("bytes_in_use", 0)) - mine), tuple(largest)))
    return found


def _decisions(model: Any) -> dict[str, str]:
    """Why each variable has its layout (`KmpModelParallel.decisions`), by path: a variable
    the user's map leaves replicated is named so in the error."""
    from keras_mgpu_plugins.backends.jax import models

    distribution = models.distribution_of(model)
    return {path: why for path, (_, why) in getattr(distribution, "decisions", {}).items()}


def check(model: Any, strategy: str) -> list[DeviceNeed]:
    """Raises `ModelTooLargeError` if a device cannot hold its part of `model` for training.

    Returns:
        Each checked device's `DeviceNeed` (empty where the platform reports no memory).
    """
    found = needs(model)
    short = [n for n in found if not n.fits]
    if short:
        raise ModelTooLargeError(_message(short, strategy), short)
    return found


def _message(short: list[DeviceNeed], strategy: str) -> str:
    per = "; ".join(
        f"{n.device} needs {n.needed_bytes:,} bytes ({_size(n.needed_bytes)}: parameters "
        f"{_size(n.parameter_bytes)} + optimizer slots {_size(n.optimizer_bytes)}, "
        f"{n.optimizer_how}) and has {n.available_bytes:,} bytes available "
        f"({_size(n.available_bytes)}: bytes_limit {n.limit_bytes:,} less {n.other_bytes:,} "
        "in use by other arrays); largest variables there: "
        + ", ".join(f"{path} {_size(size)}" for path, size in n.largest) for n in short)
    return (
        f"The model does not fit in device memory even sharded (strategy={strategy!r}): "
        f"before its first step, its parameters and optimizer slots need more than a device "
        f"can hold. {per}. Activations and gradients need more on top. Shard over more "
        "devices (devices=, or more processes with 'hybrid'), shard the largest variables "
        "(layout_map=), use a smaller model or an optimizer with fewer slots (SGD: none).")


def check_every_process(model: Any, strategy: str) -> list[DeviceNeed]:
    """`check` on each process's devices; if it raises on one process, it raises on all
    (`Runtime.together`: one all-gather when there are several), so none waits alone."""
    from keras_mgpu_plugins.backends.jax.runtime import JaxRuntime

    return JaxRuntime().together(lambda: check(model, strategy),
                                 "the check that the model fits in device memory")
