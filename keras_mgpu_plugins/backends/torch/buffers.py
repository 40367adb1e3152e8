"""The non-trainable variables a training step writes (BatchNormalization's moving
statistics, a dropout layer's seed state), found by torch's version counters.

Keras on torch assigns a variable in place (`copy_`), which bumps the tensor's version
counter: the variables whose counter moved during the first step of a fit are the ones a
step writes. The processes agree on that list (one all-gather of the flags: any process's
write counts), so every process syncs the same variables, in the same order, after every
step (`steps.global_logs`). A frozen base model's weights, which no step writes, are never
sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def candidates(model: Any) -> list:
    """The model's non-trainable variables that hold numbers (not its metrics')."""
    import torch

    metric_ids = {id(v) for v in model.metrics_variables}
    return [v for v in model.non_trainable_variables if id(v) not in metric_ids
            and v.value.dtype != torch.bool and not v.value.dtype.is_complex]


def versions(model: Any) -> list[tuple[Any, int]]:
    """Each candidate and its tensor's version counter now."""
    return [(v, v.value._version) for v in candidates(model)]


def written(model: Any, before: list[tuple[Any, int]]) -> list:
    """The candidates that any process's step wrote since `before` (one all-gather)."""
    from keras_mgpu_plugins.backends.torch.runtime import TorchRuntime

    flags = np.array([v.value._version != version for v, version in before], np.int64)
    if not len(flags):
        return []
    every = TorchRuntime().all_gather(flags) if TorchRuntime().spans_workers else flags[None]
    return [v for (v, _), moved in zip(before, every.any(axis=0), strict=True) if moved]
