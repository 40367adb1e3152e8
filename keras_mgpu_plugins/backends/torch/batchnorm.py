"""`@kmp.parallelize(sync_batchnorm=True)` on torch: BatchNormalization's batch statistics
over the global batch (the per-instance patch `torch_sync_batchnorm`).

Keras's `BatchNormalization(synchronized=True)` is TensorFlow's only. Here each layer's
`_moments` sums its inputs and their squares over the reduced axes, with their count,
and all-reduces the three (`_AllReduce`: a sum whose backward sums the gradients over
every process too): mean `S / N`, variance `Q / N - mean**2` over every
process's rows, as Keras's own torch `moments` computes them on one device. A batch fed
whole to every process counts rank 0's copy only.
"""

from __future__ import annotations

import functools
from typing import Any

from keras_mgpu_plugins.backends.torch import collectives, steps


def wrap_moments(layer: Any) -> None:
    """The patch: `layer._moments` over every process."""
    original = layer._moments

    @functools.wraps(original)
    def moments(inputs: Any, mask: Any) -> Any:
        step = steps.current()
        if step is None or step.processes == 1:
            return original(inputs, mask)
        if mask is not None:
            raise NotImplementedError(
                f"{layer.name}: kmp.parallelize(sync_batchnorm=True) on torch computes batch "
                "statistics over every process for unmasked inputs only. Pass "
                "sync_batchnorm=False (each process's own statistics), or drop the mask.")
        return global_moments(inputs, _axes(layer), step)

    layer._moments = moments


def _axes(layer: Any) -> list[int]:
    from keras_mgpu_plugins.compat._torch import batchnorm_reduction_axes

    return batchnorm_reduction_axes(layer)


def global_moments(inputs: Any, axes: list[int], step: Any) -> tuple[Any, Any]:
    """Mean and variance of `inputs` over `axes` and every process (see the module docstring)."""
    import torch

    x = inputs if inputs.dtype in (torch.float32, torch.float64) else inputs.float()
    count = 1
    for axis in axes:
        count *= x.shape[axis]
    counted = 0.0 if step.whole and collectives.world()[0] != 0 else 1.0
    total = torch.sum(x, dim=axes) * counted
    squares = torch.sum(x * x, dim=axes) * counted
    size = total.numel()
    wire = torch.cat([total.reshape(-1), squares.reshape(-1),
                      torch.tensor([count * counted], dtype=x.dtype, device=x.device)])
    device = collectives.device()
    summed = _all_reduce()(wire.to(device)).to(x.device)
    n = summed[-1]
    mean = (summed[:size] / n).reshape(total.shape)
    variance = (summed[size:2 * size] / n).reshape(total.shape) - mean * mean
    if inputs.dtype == torch.float16:
        limit = torch.finfo(torch.float16).max
        mean, variance = mean.clamp(-limit, limit), variance.clamp(-limit, limit)
    return mean.to(inputs.dtype), variance.to(inputs.dtype)


@functools.cache
def _all_reduce() -> Any:
    """`torch.autograd.Function` summing a tensor over every process, forward and backward."""
    import torch

    class _AllReduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, tensor: Any) -> Any:
            return collectives.all_reduce_(tensor.clone())

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return collectives.all_reduce_(grad.clone())

    return _AllReduce.apply
