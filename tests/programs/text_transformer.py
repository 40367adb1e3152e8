"""A Transformer text classifier, after
https://keras.io/examples/nlp/text_classification_with_transformer/.

The example's `TransformerBlock` and `TokenAndPositionEmbedding` layers (two
`Embedding`s: sparse gradients), its functional head (GlobalAveragePooling1D,
Dropout, Dense), its compile arguments (`"adam"`, sparse categorical cross-entropy,
accuracy) and its `fit` with `validation_data`. Here on random token sequences: a
vocabulary of 50, sequences of 10, embeddings of 8, the dropout rates at 0.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

VOCAB_SIZE, MAXLEN = 50, 10
EMBED_DIM, NUM_HEADS, FF_DIM = 8, 2, 8
ROWS, BATCH_SIZE, EPOCHS = 256, 32, 2


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                     layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attended = self.dropout1(self.att(inputs, inputs))
        out1 = self.layernorm1(inputs + attended)
        return self.layernorm2(out1 + self.dropout2(self.ffn(out1)))


class TokenAndPositionEmbedding(layers.Layer):
    """One embedding for the tokens, one for their positions, summed."""

    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        positions = self.pos_emb(ops.arange(start=0, stop=ops.shape(x)[-1], step=1))
        return self.token_emb(x) + positions


def data() -> dict:
    rng = np.random.default_rng(19)
    x = rng.integers(1, VOCAB_SIZE, size=(ROWS, MAXLEN))
    y = (x[:, :3].sum(axis=1) % 2).astype("int64")  # learnable: a parity of the first tokens
    x_val = rng.integers(1, VOCAB_SIZE, size=(64, MAXLEN))
    y_val = (x_val[:, :3].sum(axis=1) % 2).astype("int64")
    return {"fit": (x, y),
            "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS,
                           "validation_data": (x_val, y_val)},
            "evaluate": {"x": x_val, "y": y_val, "batch_size": BATCH_SIZE}}


def build(optimizer: str = "program") -> keras.Model:
    keras.utils.set_random_seed(4)
    inputs = layers.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB_SIZE, EMBED_DIM)(inputs)
    x = TransformerBlock(EMBED_DIM, NUM_HEADS, FF_DIM, rate=0.0)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.0)(x)
    x = layers.Dense(20, activation="relu")(x)
    x = layers.Dropout(0.0)(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam" if optimizer == "program" else keras.optimizers.SGD(0.05),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
