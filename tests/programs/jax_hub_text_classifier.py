"""A keras-hub task trained with its own `fit`, after keras-hub's text classification
guide (https://keras.io/keras_hub/getting_started/: `BertTextClassifier`, `fit` on
inputs the task batches itself).

A `BertTextClassifier` built from a small `BertBackbone` config (no preset: nothing
downloads) with `preprocessor=None`, so `fit` takes token ids as the guide's
preprocessed variant does; the task compiles itself at construction (its defaults:
`Adam(5e-5)`, sparse cross-entropy from logits, sparse categorical accuracy). Its class
overrides `fit(self, x=None, y=None, batch_size=None, **kwargs)` and batches numpy inputs
into a grain dataset before calling `super().fit` (keras-hub needs `grain` for that
without TensorFlow). 75 rows of 12 tokens, a last batch of 11; `predict` on 33 rows.
"""

from __future__ import annotations

import keras
import numpy as np

ROWS, LENGTH, VOCAB, BATCH_SIZE, EPOCHS = 75, 12, 50, 16, 2


def data() -> dict:
    rng = np.random.default_rng(13)

    def inputs(rows: int) -> dict:
        return {"token_ids": rng.integers(1, VOCAB, (rows, LENGTH)).astype("int32"),
                "segment_ids": np.zeros((rows, LENGTH), "int32"),
                "padding_mask": np.ones((rows, LENGTH), "int32")}

    x, x_test = inputs(ROWS), inputs(33)
    y, y_test = rng.integers(0, 3, ROWS), rng.integers(0, 3, 33)
    return {"fit": (x, y), "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS},
            "evaluate": {"x": x_test, "y": y_test, "batch_size": BATCH_SIZE},
            "predict": {"x": x_test, "batch_size": BATCH_SIZE}}


def build(optimizer: str = "program") -> keras.Model:
    import keras_hub

    keras.utils.set_random_seed(8)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16,
                                             max_sequence_length=LENGTH)
    classifier = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=3,
                                                     preprocessor=None, dropout=0.0)
    if optimizer != "program":  # the task compiled itself with its defaults
        classifier.compile(optimizer=keras.optimizers.SGD(0.1))
    return classifier
