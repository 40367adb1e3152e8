"""A miniature GPT, after keras.io's "Text generation with a miniature GPT"
(https://keras.io/examples/generative/text_generation_with_miniature_gpt/).

The example's `causal_attention_mask`, `TransformerBlock` (MultiHeadAttention with the
causal mask, dropout 0.1, LayerNormalization, a feed-forward Sequential),
`TokenAndPositionEmbedding`, its functional model with two outputs (the logits and the
block's output) compiled with `"adam"` and `loss=[SparseCategoricalCrossentropy(
from_logits=True), None]`, and its `TextGenerator` callback, which calls
`self.model.predict` on one row after each epoch and samples the next token from the
top k. Here a vocabulary of 64, sequences of 12, embeddings of 16 (the example: 20000,
80, 256), on random token ids, and `predict` on 23 rows. One change to the example: its
mask's tile counts are a tuple, not a tensor (JAX 0.7 and newer refuse a traced one, in
plain Keras on one device too).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

VOCAB_SIZE, MAXLEN, EMBED_DIM, NUM_HEADS, FEED_FORWARD_DIM = 64, 12, 16, 2, 32
ROWS, BATCH_SIZE, EPOCHS = 59, 16, 2
LARGE = True  # a large-model program: also trained with strategy="model_parallel"


def causal_attention_mask(batch_size, n_dest, n_src, dtype):
    i = ops.arange(n_dest)[:, None]
    j = ops.arange(n_src)
    m = i >= j - n_src + n_dest
    mask = ops.cast(m, dtype)
    mask = ops.reshape(mask, [1, n_dest, n_src])
    mult = (batch_size, 1, 1)  # the example: a tensor (JAX >= 0.7 refuses it, plain Keras too)
    return ops.tile(mask, mult)


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads, embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                     layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        input_shape = ops.shape(inputs)
        batch_size = input_shape[0]
        seq_len = input_shape[1]
        causal_mask = causal_attention_mask(batch_size, seq_len, seq_len, "bool")
        attention_output = self.att(inputs, inputs, attention_mask=causal_mask)
        attention_output = self.dropout1(attention_output)
        out1 = self.layernorm1(inputs + attention_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(0, maxlen, 1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


def create_model(optimizer="adam"):
    inputs = layers.Input(shape=(MAXLEN,), dtype="int32")
    embedding_layer = TokenAndPositionEmbedding(MAXLEN, VOCAB_SIZE, EMBED_DIM)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(EMBED_DIM, NUM_HEADS, FEED_FORWARD_DIM)
    x = transformer_block(x)
    outputs = layers.Dense(VOCAB_SIZE)(x)
    model = keras.Model(inputs=inputs, outputs=[outputs, x])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer, loss=[loss_fn, None])
    return model


class TextGenerator(keras.callbacks.Callback):
    """The example's callback: after each epoch, generates `max_tokens` tokens from
    `start_tokens` with `model.predict` on one row (kept in `self.generated`)."""

    def __init__(self, max_tokens, start_tokens, top_k=10, print_every=1):
        super().__init__()
        self.max_tokens = max_tokens
        self.start_tokens = start_tokens
        self.print_every = print_every
        self.k = top_k
        self.generated = []

    def sample_from(self, logits):
        logits, indices = ops.top_k(logits, k=self.k, sorted=True)
        indices = np.asarray(indices).astype("int32")
        preds = keras.activations.softmax(ops.expand_dims(logits, 0))[0]
        preds = np.asarray(preds).astype("float32")
        return np.random.choice(indices, p=preds / preds.sum())

    def on_epoch_end(self, epoch, logs=None):
        start_tokens = [_ for _ in self.start_tokens]
        if (epoch + 1) % self.print_every != 0:
            return
        num_tokens_generated = 0
        tokens_generated = []
        while num_tokens_generated <= self.max_tokens:
            pad_len = MAXLEN - len(start_tokens)
            sample_index = len(start_tokens) - 1
            if pad_len < 0:
                x = start_tokens[:MAXLEN]
                sample_index = MAXLEN - 1
            elif pad_len > 0:
                x = start_tokens + [0] * pad_len
            else:
                x = start_tokens
            x = np.array([x])
            y, _ = self.model.predict(x, verbose=0)
            sample_token = self.sample_from(y[0][sample_index])
            tokens_generated.append(int(sample_token))
            start_tokens.append(sample_token)
            num_tokens_generated = len(tokens_generated)
        self.generated.append(tokens_generated)


def data() -> dict:
    rng = np.random.default_rng(9)
    tokens = rng.integers(1, VOCAB_SIZE, size=(ROWS, MAXLEN + 1)).astype("int32")
    x, y = tokens[:, :-1], tokens[:, 1:]  # the example's prepare_lm_inputs_labels
    return {"fit": (x, y), "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS},
            "evaluate": {"x": x[:27], "y": y[:27], "batch_size": BATCH_SIZE},
            "predict": {"x": x[:23], "batch_size": BATCH_SIZE}}


def callbacks(directory, parallel):
    return [TextGenerator(4, [3, 7, 11])]


def build(optimizer: str = "program") -> keras.Model:
    keras.utils.set_random_seed(6)
    return create_model("adam" if optimizer == "program" else keras.optimizers.SGD(0.1))
