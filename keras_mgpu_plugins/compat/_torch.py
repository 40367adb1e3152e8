"""Helpers over private Keras and torch API for the torch lane (`backends/torch`).

Each calls `require(name)` for its `PrivateUse` (`compat._torch_uses`), which checks that
the installed version still has what it relies on, and applies the documented fallback
or raises outside the known versions.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from keras_mgpu_plugins.compat._private_uses import require
from keras_mgpu_plugins.compat._torch_uses import C10D, TORCH_TRAINER


def default_store() -> Any:
    """The default process group's key-value store, or `None` where this torch hides it."""
    if not require("torch_default_store"):
        return None
    return importlib.import_module(C10D)._get_default_store()


def keras_has_upstream_ddp() -> bool:
    """Whether the installed Keras wraps the model in `DistributedDataParallel` in `fit` where
    a process group exists (keras-team/keras#23316: keras-nightly 3.16.0.dev; no release up
    to 3.15.1 does). Read once per process (each training step asks)."""
    import keras

    return keras.backend.backend() == "torch" and _upstream_ddp(keras.__version__)


@functools.cache
def _upstream_ddp(version: str) -> bool:
    if not require("torch_upstream_ddp"):
        return False
    module = importlib.import_module(TORCH_TRAINER)
    return any(hasattr(getattr(module, name, None), "_initialize_ddp")
               for name in ("Trainer", "TorchTrainer"))


def upstream_ddp_model(model: Any) -> Any:
    """The `DistributedDataParallel` Keras made of `model` in this fit (`None`: none)."""
    if not keras_has_upstream_ddp():
        return None
    return vars(model).get("ddp_model")


def batchnorm_reduction_axes(layer: Any) -> list[int]:
    """The axes a `BatchNormalization` layer computes its statistics over (built layers)."""
    require("batchnorm_moments")
    return list(layer._reduction_axes)
