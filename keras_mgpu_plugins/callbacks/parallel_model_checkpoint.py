"""`ParallelModelCheckpoint`: `ModelCheckpoint` spelled as the multi-GPU recipe does.

The template model comes first (`ParallelModelCheckpoint(template, filepath)`);
everything else is `ModelCheckpoint(filepath, model=template)`.
"""

from __future__ import annotations

import os
from typing import Any

import keras

from keras_mgpu_plugins.callbacks.model_checkpoint import ModelCheckpoint


class ParallelModelCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` taking the template model first, as the multi-GPU recipe does.

    `ParallelModelCheckpoint(template, filepath, **kwargs)` is
    `ModelCheckpoint(filepath, model=template, **kwargs)`: the template gets
    the trained weights and is what is saved.

    Args:
        model: The template `keras.Model` (e.g. the one given to
            `multi_gpu_model`).
        filepath: See `ModelCheckpoint`.
        **kwargs: Any other `ModelCheckpoint` argument.

    Example:
        >>> parallel = kmp.multi_gpu_model(template, gpus=2)
        >>> parallel.compile(optimizer="sgd", loss="mse")
        >>> parallel.fit(x, y, callbacks=[
        ...     kmp.callbacks.ParallelModelCheckpoint(template, "best.keras",
        ...                                           save_best_only=True)])
    """

    def __init__(
        self, model: keras.Model, filepath: str | os.PathLike, *args: Any, **kwargs: Any
    ) -> None:
        if model is None:
            raise TypeError(
                "ParallelModelCheckpoint needs the template model first. Received: model=None"
            )
        super().__init__(filepath, *args, model=model, **kwargs)
