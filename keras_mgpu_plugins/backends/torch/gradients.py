"""kmp's gradient averaging on torch: every process's optimizer applies the global batch's
gradient (the per-instance patch `torch_gradients_averaged`).

The global batch's loss is the processes' losses weighted by their share of the step's
rows (`steps.Step.weight`: `n_p / n`, `1 / P` for a batch fed whole). `scale_loss` (which
Keras's `train_step` calls before the backward pass) multiplies this process's loss by
its weight, so the backward pass computes this process's part of the global gradient,
paths through other processes included (`sync_batchnorm`'s all-reduce carries the
weighted gradients back); `apply` then sums the parts over the processes (one all-reduce
per dtype, of every gradient flattened), so the update is one device's on the global
batch, even where a last batch splits unevenly. A `train_step` of the user's that never
calls `scale_loss` (keras.io's torch recipe) gets its gradients weighted in `apply`
instead. A gradient that is `None` (a variable the loss does not reach) stays `None`.
Under a `LossScaleOptimizer` the parts are summed before it checks them, so every process
skips the same steps.

Where Keras itself wraps the model in `DistributedDataParallel` (keras-team/keras#23316)
and this step's forward ran through it, DDP averages the weighted parts in the backward
pass; `apply` multiplies DDP's average by `P` (their sum) instead of all-reducing again.
The loss is weighted the same way on both paths, so the backward pass's intermediate
values have one device's magnitudes: under `mixed_float16` a step overflows (and the loss
scale skips it) exactly where one device's does (a loss left unweighted, as DDP alone
leaves it, overflows float16 at another scale: measured 0.037 off one device).
"""

from __future__ import annotations

import functools
from typing import Any

from keras_mgpu_plugins.backends.torch import collectives, steps


def wrap_optimizer(optimizer: Any) -> None:
    """The patch: `apply` and `scale_loss` of `optimizer` as described above."""
    apply, scale_loss = optimizer.apply, optimizer.scale_loss

    @functools.wraps(apply)
    def summed_apply(grads: Any, trainable_variables: Any = None) -> Any:
        step = steps.current()
        if step is not None and step.ddp_forward:  # DDP averaged the weighted parts: P x that
            return apply(_times(list(grads), step.processes if step.loss_weighted else 1),
                         trainable_variables)
        weighted = step is not None and step.loss_weighted
        weight = 1.0 if weighted else (step.weight if step is not None else None)
        return apply(all_reduce(list(grads), weight), trainable_variables)

    @functools.wraps(scale_loss)
    def weighted_scale_loss(loss: Any) -> Any:
        loss = scale_loss(loss)
        step = steps.current()
        if step is None or step.processes == 1:
            return loss
        step.loss_weighted = True
        return loss if step.weight == 1.0 else loss * step.weight

    optimizer.apply, optimizer.scale_loss = summed_apply, weighted_scale_loss


def all_reduce(grads: list, weight: float | None) -> list:
    """The processes' `grads`, each process's times `weight` (default `1 / P`), summed."""
    import torch

    count = collectives.world()[1]
    if count == 1:
        return grads
    weight = 1.0 / count if weight is None else weight
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(grads):
        if g is not None:
            groups.setdefault(g.dtype, []).append(i)
    out = list(grads)  # which gradients exist is the same on every process (one model)
    for _, indices in sorted(groups.items(), key=lambda kv: str(kv[0])):
        flat = torch.cat([grads[i].detach().reshape(-1) for i in indices]) * weight
        collectives.all_reduce_(flat)
        offset = 0
        for i in indices:
            n = grads[i].numel()
            out[i] = flat[offset:offset + n].reshape(grads[i].shape)
            offset += n
    return out


def _times(grads: list, factor: int) -> list:
    return grads if factor == 1 else [g * factor if g is not None else None for g in grads]
