"""A keras-hub causal LM with the backbone's own layout map, after keras-hub's Gemma
distribution example (`GemmaBackbone.get_layout_map`, https://keras.io/api/keras_hub/
models/gemma/gemma_backbone/) and its fine-tuning recipe (a `PolynomialDecay` learning
rate, `weighted_metrics=["accuracy"]`).

A `GemmaCausalLM` on a small `GemmaBackbone` config (no preset: nothing downloads),
`preprocessor=None` (token ids, padding mask, labels and sample weights given as the
preprocessor would give them), recompiled as the recipe does with `Adam` over a
`PolynomialDecay` schedule. For `strategy="model_parallel"`, the layout map is the
backbone's own: `GemmaBackbone.get_layout_map(mesh)` on a `("batch", "model")` mesh.
"""

from __future__ import annotations

import keras
import numpy as np

ROWS, LENGTH, VOCAB, BATCH_SIZE, EPOCHS = 43, 10, 64, 8, 2
LARGE = True  # a large-model program: also trained with strategy="model_parallel"


def data() -> dict:
    rng = np.random.default_rng(17)

    def inputs(rows: int) -> tuple:
        tokens = rng.integers(1, VOCAB, (rows, LENGTH + 1)).astype("int32")
        lengths = rng.integers(LENGTH // 2, LENGTH + 1, rows)
        mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype("int32")
        x = {"token_ids": tokens[:, :-1] * mask, "padding_mask": mask}
        return x, tokens[:, 1:] * mask, mask.astype("float32")

    x, y, weights = inputs(ROWS)
    x_test, y_test, weights_test = inputs(19)
    return {"fit": (x, y), "fit_kwargs": {"sample_weight": weights, "batch_size": BATCH_SIZE,
                                          "epochs": EPOCHS},
            "evaluate": {"x": x_test, "y": y_test, "sample_weight": weights_test,
                         "batch_size": BATCH_SIZE},
            "predict": {"x": x_test, "batch_size": BATCH_SIZE}}


def backbone_class():
    import keras_hub

    return keras_hub.models.GemmaBackbone


def build(optimizer: str = "program") -> keras.Model:
    import keras_hub

    keras.utils.set_random_seed(10)
    backbone = backbone_class()(vocabulary_size=VOCAB, num_layers=1, num_query_heads=2,
                                num_key_value_heads=2, hidden_dim=16, intermediate_dim=64,
                                head_dim=8)
    causal_lm = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    steps = -(-ROWS // BATCH_SIZE) * EPOCHS
    learning_rate = keras.optimizers.schedules.PolynomialDecay(
        5e-3, decay_steps=steps, end_learning_rate=0.0)
    causal_lm.compile(
        optimizer=keras.optimizers.Adam(learning_rate) if optimizer == "program"
        else keras.optimizers.SGD(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"])
    return causal_lm


def layout_map():
    """The backbone's own map, as keras-hub's docs build it."""
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((1, len(devices)), ("batch", "model"), devices)
    return backbone_class().get_layout_map(mesh, model_parallel_dim_name="model",
                                           data_parallel_dim_name="batch")
