"""A Vision Transformer, after
https://keras.io/examples/vision/image_classification_with_vision_transformer/.

The example's `Patches` and `PatchEncoder` layers (a Dense projection plus a learnt
position `Embedding`: its gradient is sparse), its `mlp` helper, the Transformer
blocks of `create_vit_classifier`, its compile arguments (AdamW, logits with sparse
cross-entropy, accuracy and top-5 accuracy) and its `run_experiment` (a
`ModelCheckpoint` keeping the best `val_accuracy` weights, loaded back before
`evaluate`). Here: 8x8 images resized to 12x12, 9 patches, 2 blocks, tiny widths, the
dropout rates at 0 and the random augmentation layers (flip, rotation, zoom) left out:
they draw different numbers on each replica.
"""

from __future__ import annotations

import functools
import os

import keras
import numpy as np
from keras import layers, ops

NUM_CLASSES = 10
INPUT_SHAPE = (8, 8, 3)
LEARNING_RATE, WEIGHT_DECAY = 0.001, 0.0001
BATCH_SIZE, EPOCHS = 20, 2  # 200 rows, validation_split=0.1: 9 batches of 20
IMAGE_SIZE, PATCH_SIZE = 12, 4
NUM_PATCHES = (IMAGE_SIZE // PATCH_SIZE) ** 2
PROJECTION_DIM, NUM_HEADS = 8, 2
HIDDEN_DIM = PROJECTION_DIM * NUM_HEADS
TRANSFORMER_UNITS = [HIDDEN_DIM * 2, HIDDEN_DIM]
TRANSFORMER_LAYERS = 2
MLP_HEAD_UNITS = [16, 8]
CHECKPOINT = "checkpoint.weights.h5"


@functools.lru_cache(maxsize=1)
def _arrays() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(13)
    x = rng.uniform(0, 255, size=(200, *INPUT_SHAPE)).astype("float32")
    y = rng.integers(0, NUM_CLASSES, size=(200, 1))
    x_test = rng.uniform(0, 255, size=(40, *INPUT_SHAPE)).astype("float32")
    y_test = rng.integers(0, NUM_CLASSES, size=(40, 1))
    return x, y, x_test, y_test


def data() -> dict:
    x, y, x_test, y_test = _arrays()
    return {"fit": (x, y),
            "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS, "validation_split": 0.1},
            "evaluate": {"x": x_test, "y": y_test, "batch_size": BATCH_SIZE}}


def mlp(x, hidden_units, dropout_rate):
    for units in hidden_units:
        x = layers.Dense(units, activation=keras.activations.gelu)(x)
        x = layers.Dropout(dropout_rate)(x)
    return x


class Patches(layers.Layer):
    """Cuts each image into `patch_size` squares, one row of pixels per patch."""

    def __init__(self, patch_size):
        super().__init__()
        self.patch_size = patch_size

    def call(self, images):
        shape = ops.shape(images)
        rows, columns = shape[1] // self.patch_size, shape[2] // self.patch_size
        patches = keras.ops.image.extract_patches(images, size=self.patch_size)
        return ops.reshape(patches, (shape[0], rows * columns,
                                     self.patch_size * self.patch_size * shape[3]))

    def get_config(self):
        config = super().get_config()
        config.update({"patch_size": self.patch_size})
        return config


class PatchEncoder(layers.Layer):
    """Projects each patch and adds a learnt embedding of its position."""

    def __init__(self, num_patches, projection_dim):
        super().__init__()
        self.num_patches = num_patches
        self.projection = layers.Dense(units=projection_dim)
        self.position_embedding = layers.Embedding(input_dim=num_patches,
                                                   output_dim=projection_dim)

    def call(self, patch):
        positions = ops.expand_dims(ops.arange(start=0, stop=self.num_patches, step=1), axis=0)
        return self.projection(patch) + self.position_embedding(positions)

    def get_config(self):
        config = super().get_config()
        config.update({"num_patches": self.num_patches})
        return config


def create_vit_classifier():
    data_augmentation = keras.Sequential(
        [layers.Normalization(), layers.Resizing(IMAGE_SIZE, IMAGE_SIZE)],
        name="data_augmentation",
    )
    data_augmentation.layers[0].adapt(_arrays()[0])  # mean and variance of the training images
    inputs = keras.Input(shape=INPUT_SHAPE)
    patches = Patches(PATCH_SIZE)(data_augmentation(inputs))
    encoded_patches = PatchEncoder(NUM_PATCHES, HIDDEN_DIM)(patches)
    for _ in range(TRANSFORMER_LAYERS):
        x1 = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
        attention_output = layers.MultiHeadAttention(
            num_heads=NUM_HEADS, key_dim=PROJECTION_DIM, dropout=0.0)(x1, x1)
        x2 = layers.Add()([attention_output, encoded_patches])
        x3 = layers.LayerNormalization(epsilon=1e-6)(x2)
        x3 = mlp(x3, hidden_units=TRANSFORMER_UNITS, dropout_rate=0.0)
        encoded_patches = layers.Add()([x3, x2])
    representation = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
    representation = layers.Flatten()(representation)
    representation = layers.Dropout(0.0)(representation)
    features = mlp(representation, hidden_units=MLP_HEAD_UNITS, dropout_rate=0.0)
    logits = layers.Dense(NUM_CLASSES)(features)
    return keras.Model(inputs=inputs, outputs=logits)


def build(optimizer: str = "program") -> keras.Model:
    keras.utils.set_random_seed(2)
    model = create_vit_classifier()
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
        if optimizer == "program" else keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                 keras.metrics.SparseTopKCategoricalAccuracy(5, name="top-5-accuracy")],
    )
    return model


def callbacks(directory: str, parallel: bool) -> list:
    """The example's checkpoint of the best validation accuracy (kmp's drop-in when parallel)."""
    if parallel:
        import keras_mgpu_plugins as kmp

        checkpoint = kmp.callbacks.ModelCheckpoint
    else:
        checkpoint = keras.callbacks.ModelCheckpoint
    return [checkpoint(os.path.join(directory, CHECKPOINT), monitor="val_accuracy",
                       save_best_only=True, save_weights_only=True)]


def after_fit(model: keras.Model, directory: str) -> None:
    model.load_weights(os.path.join(directory, CHECKPOINT))
