"""FLOPs of a training step on torch: `torch.utils.flop_counter.FlopCounterMode` around a real step.

`run_and_count` runs the step `fit` asked for under `FlopCounterMode`, which counts the
matrix products, convolutions and attention of the forward and backward pass as they run
(2 FLOPs per multiply-add; elementwise ops and the optimizer's update are not counted), at
this process's part of the global batch. torch's table has no entry for the CPU's fused
attention (`aten._scaled_dot_product_flash_attention_for_cpu`, what
`keras.layers.MultiHeadAttention` runs on a CPU): kmp adds it with torch's own formula.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins._flop_count import FlopCount, per_sample, tokens_per_sample

METHOD = "torch's FlopCounterMode on a real step"
#: The CPU's fused attention ops, forward and backward (not in torch's own table).
CPU_ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention_for_cpu_backward")


def run_and_count(model: Any, original: Callable[..., Any], args: tuple) -> tuple[Any, FlopCount]:
    """`original(*args)` (Keras's `train_function(data)`, `data` a list of batches) under
    `FlopCounterMode`, and the FLOPs it counted per row of the batch."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        tokens, rows = _batch(args)
        counter = FlopCounterMode(display=False, custom_mapping=_cpu_attention())
    except Exception as err:  # noqa: BLE001 - monitoring must not stop training
        return original(*args), FlopCount.absent(f"counting failed: {type(err).__name__}: {err}")
    with counter:
        result = original(*args)
    return result, per_sample(counter.get_total_flops(), rows, METHOD, tokens)


def _batch(args: tuple) -> tuple[float, int]:
    """Tokens per row and rows of the step's batch (`args[0]`: Keras's list of batches)."""
    import keras

    data = args[0][0] if args and isinstance(args[0], (list, tuple)) and args[0] else None
    x = keras.utils.unpack_x_y_sample_weight(data)[0] if data is not None else None
    leaves = [leaf for leaf in keras.tree.flatten(x) if getattr(leaf, "shape", ())]
    tokens = tokens_per_sample((tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves)
    return tokens, int(leaves[0].shape[0]) if leaves else 0


def _cpu_attention() -> dict:
    """FLOP formulas for the CPU's fused attention, torch's own (`sdpa_flop_count`)."""
    import torch
    from torch.utils import flop_counter

    forward, backward = (getattr(torch.ops.aten, name, None) for name in CPU_ATTENTION)
    mapping = {}
    if forward is not None and hasattr(flop_counter, "sdpa_flop_count"):
        def forward_flops(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
            return flop_counter.sdpa_flop_count(query, key, value)

        mapping[forward] = forward_flops
    if backward is not None and hasattr(flop_counter, "sdpa_backward_flop_count"):
        def backward_flops(grad: Any, query: Any, key: Any, value: Any, *args: Any,
                           **kwargs: Any) -> int:
            return flop_counter.sdpa_backward_flop_count(grad, query, key, value)

        mapping[backward] = backward_flops
    return mapping


def compute_devices() -> list[str]:
    """This process's device: its GPU's name, or `"cpu"`."""
    from keras_mgpu_plugins.backends.torch.devices import local_device_names

    names = []
    for name in local_device_names():
        kind, _, index = name.partition(":")
        if kind == "GPU":
            import torch

            names.append(torch.cuda.get_device_name(int(index or 0)))
        else:
            names.append("cpu")
    return names or ["cpu"]


def float32_on_tensor_cores() -> bool:
    """Whether float32 matmuls may use TF32 (`torch.set_float32_matmul_precision`; torch's
    default, "highest", does not)."""
    import torch

    return torch.get_float32_matmul_precision() != "highest"
