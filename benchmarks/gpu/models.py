"""The models and inputs of the GPU run's throughput part (any Keras backend).

- `resnet`: a ResNet-18 in the CIFAR layout (3x3 stem, 4 stages of 2 basic blocks,
  widths 64-512, strides 1-2-2-2), 32x32x3 images, 10 classes, SGD with momentum.
- `transformer`: a GPT-style decoder (pre-norm blocks of causal multi-head attention and
  a 4x MLP), learned positions, next-token loss over a vocabulary, AdamW.

Both train under `keras.mixed_precision` `"mixed_bfloat16"` (bf16 compute, float32
variables), their logits in float32. `Batches` feeds the same few batches again and
again, so that a long fit needs no host array of every step.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

POLICY = "mixed_bfloat16"


def resnet(image: int, widths: list[int], blocks: int, classes: int = 10) -> keras.Model:
    inputs = keras.Input((image, image, 3))
    x = _conv_bn(inputs, widths[0], 3, 1)
    x = layers.ReLU()(x)
    for stage, width in enumerate(widths):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = layers.ReLU()(_conv_bn(x, width, 3, stride))
            y = _conv_bn(y, width, 3, 1)
            shortcut = x if stride == 1 and x.shape[-1] == width else _conv_bn(x, width, 1, stride)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, layers.Dense(classes, dtype="float32")(x), name="resnet")
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _conv_bn(x, width: int, kernel: int, stride: int):
    x = layers.Conv2D(width, kernel, strides=stride, padding="same", use_bias=False)(x)
    return layers.BatchNormalization()(x)


class Positions(layers.Layer):
    """Adds a learned embedding of each position."""

    def build(self, input_shape) -> None:
        self.table = self.add_weight(shape=tuple(input_shape[1:]), initializer="random_normal",
                                     name="positions")

    def call(self, x):
        return x + keras.ops.cast(self.table, x.dtype)


def transformer(seq: int, dim: int, heads: int, depth: int, vocab: int) -> keras.Model:
    tokens = keras.Input((seq,), dtype="int32")
    x = Positions()(layers.Embedding(vocab, dim)(tokens))
    for _ in range(depth):
        h = layers.LayerNormalization()(x)
        h = layers.MultiHeadAttention(heads, dim // heads)(h, h, use_causal_mask=True)
        x = layers.Add()([x, h])
        h = layers.LayerNormalization()(x)
        h = layers.Dense(dim)(layers.Dense(4 * dim, activation="gelu")(h))
        x = layers.Add()([x, h])
    x = layers.LayerNormalization()(x)
    model = keras.Model(tokens, layers.Dense(vocab, dtype="float32")(x), name="transformer")
    model.compile(optimizer=keras.optimizers.AdamW(3e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class Batches(keras.utils.PyDataset):
    """`steps` batches cycling over the first axis of `x` and `y` (a few distinct batches)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, steps: int) -> None:
        super().__init__()
        self.x, self.y, self.steps = x, y, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int):
        return self.x[index % len(self.x)], self.y[index % len(self.y)]


def inputs(kind: str, size: dict, distinct: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """`distinct` batches of random inputs and labels for model `kind`."""
    rng = np.random.default_rng(0)
    batch = size["batch"]
    if kind == "resnet":
        x = rng.normal(size=(distinct, batch, size["image"], size["image"], 3)).astype("float32")
        return x, rng.integers(0, 10, size=(distinct, batch)).astype("int32")
    shape = (distinct, batch, size["seq"])
    return (rng.integers(0, size["vocab"], size=shape).astype("int32"),
            rng.integers(0, size["vocab"], size=shape).astype("int32"))


def factory(kind: str, size: dict):
    """A function that builds and compiles model `kind` (seeded) under mixed_bfloat16."""

    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        before = keras.mixed_precision.global_policy().name
        keras.mixed_precision.set_global_policy(POLICY)
        try:
            if kind == "resnet":
                return resnet(size["image"], size["widths"], size["blocks"])
            return transformer(size["seq"], size["dim"], size["heads"], size["depth"],
                               size["vocab"])
        finally:
            keras.mixed_precision.set_global_policy(before)

    build.__name__ = build.__qualname__ = f"build_{kind}"
    return build
