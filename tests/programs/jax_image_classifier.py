"""An image classifier with augmentation layers in the model, after keras.io's "Image
classification from scratch" (https://keras.io/examples/vision/image_classification_from_scratch/).

The example's `make_model` with its data augmentation made part of the model (the
example's "option 1": `RandomFlip("horizontal")` and `RandomRotation(0.1)` on the
inputs, active in training only), `Rescaling(1/255)`, the entry block, residual blocks of
`SeparableConv2D` + `BatchNormalization` + `MaxPooling2D` with a projected residual, the
final `SeparableConv2D`, `GlobalAveragePooling2D`, `Dropout(0.25)` and one logit; compiled
with `Adam(3e-4)`, `BinaryCrossentropy(from_logits=True)` and `BinaryAccuracy(name="acc")`.
Here on 8x8 random images, one residual block, filters 8/16/32 instead of
128/256/512/728/1024, seeded
(the augmentation and dropout draw the same random numbers on any number of devices),
and `predict` on 37 test images (an odd count).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

IMAGE_SIZE, ROWS, BATCH_SIZE, EPOCHS = (8, 8), 45, 16, 2


def data() -> dict:
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 255, size=(ROWS, *IMAGE_SIZE, 3)).astype("float32")
    y = rng.integers(0, 2, size=(ROWS, 1)).astype("float32")
    x_test = rng.uniform(0, 255, size=(37, *IMAGE_SIZE, 3)).astype("float32")
    y_test = rng.integers(0, 2, size=(37, 1)).astype("float32")  # 37: an odd count
    return {"fit": (x, y),
            "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS,
                           "validation_data": (x_test[:21], y_test[:21])},
            "evaluate": {"x": x_test, "y": y_test, "batch_size": BATCH_SIZE},
            "predict": {"x": x_test, "batch_size": BATCH_SIZE}}


def make_model(input_shape, num_classes):
    data_augmentation_layers = [layers.RandomFlip("horizontal", seed=1),
                                layers.RandomRotation(0.1, seed=2)]
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for layer in data_augmentation_layers:
        x = layer(x)
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(8, 3, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous_block_activation = x
    for size in [16]:
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous_block_activation)
        x = layers.add([x, residual])
        previous_block_activation = x
    x = layers.SeparableConv2D(32, 3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    units = 1 if num_classes == 2 else num_classes
    x = layers.Dropout(0.25, seed=3)(x)
    outputs = layers.Dense(units, activation=None)(x)
    return keras.Model(inputs, outputs)


def build(optimizer: str = "program") -> keras.Model:
    keras.utils.set_random_seed(4)
    model = make_model(input_shape=IMAGE_SIZE + (3,), num_classes=2)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-4) if optimizer == "program"
        else keras.optimizers.SGD(0.05),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy(name="acc")])
    return model
