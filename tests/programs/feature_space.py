"""Structured data with a FeatureSpace, after
https://keras.io/examples/structured_data/structured_data_classification_with_feature_space/.

As in the example: a dict of columns (integer and string categories, floats
normalised and discretised, two feature crosses) in a `tf.data` pipeline, a
`keras.utils.FeatureSpace` adapted on it and mapped over it (`output_mode="concat"`),
a small functional model on the encoded features (Dense, Dropout, a sigmoid
Dense), compiled with `"adam"`, binary cross-entropy and accuracy, fitted on the
preprocessed dataset with a validation dataset. Here on 320 random rows (the
example's heart-disease CSV has 303), no shuffling, the dropout rate at 0.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf
from keras.utils import FeatureSpace

ROWS, VALIDATION_ROWS, BATCH_SIZE, EPOCHS = 320, 64, 32, 2


def _columns(rng, rows):
    return {
        "sex": rng.integers(0, 2, size=rows),
        "cp": rng.integers(0, 4, size=rows),
        "ca": rng.integers(0, 4, size=rows),
        "thal": rng.choice(["fixed", "normal", "reversible"], size=rows),
        "age": rng.uniform(29, 77, size=rows).astype("float32"),
        "trestbps": rng.normal(130, 17, size=rows).astype("float32"),
        "chol": rng.normal(245, 50, size=rows).astype("float32"),
    }


def _dataframe_to_dataset(columns, labels):
    return tf.data.Dataset.from_tensor_slices((columns, labels))  # no shuffle, unlike the example


@functools.lru_cache(maxsize=1)
def _feature_space_and_datasets():
    rng = np.random.default_rng(23)
    train, val = _columns(rng, ROWS), _columns(rng, VALIDATION_ROWS)
    train_labels = ((train["age"] > 50) ^ (train["thal"] == "normal")).astype("int64")
    val_labels = ((val["age"] > 50) ^ (val["thal"] == "normal")).astype("int64")
    train_ds = _dataframe_to_dataset(train, train_labels).batch(BATCH_SIZE)
    val_ds = _dataframe_to_dataset(val, val_labels).batch(BATCH_SIZE)
    feature_space = FeatureSpace(
        features={
            "sex": FeatureSpace.integer_categorical(num_oov_indices=0),
            "cp": FeatureSpace.integer_categorical(num_oov_indices=0),
            "ca": FeatureSpace.integer_categorical(num_oov_indices=0),
            "thal": FeatureSpace.string_categorical(num_oov_indices=0),
            "age": FeatureSpace.float_discretized(num_bins=10),
            "trestbps": FeatureSpace.float_normalized(),
            "chol": FeatureSpace.float_normalized(),
        },
        crosses=[
            FeatureSpace.cross(feature_names=("sex", "age"), crossing_dim=16),
            FeatureSpace.cross(feature_names=("thal", "ca"), crossing_dim=8),
        ],
        output_mode="concat",
    )
    feature_space.adapt(train_ds.map(lambda x, _: x))
    preprocessed_train_ds = train_ds.map(lambda x, y: (feature_space(x), y))
    preprocessed_val_ds = val_ds.map(lambda x, y: (feature_space(x), y))
    return feature_space, preprocessed_train_ds, preprocessed_val_ds


def data() -> dict:
    _, train_ds, val_ds = _feature_space_and_datasets()
    return {"fit": (train_ds,), "fit_kwargs": {"epochs": EPOCHS, "validation_data": val_ds},
            "evaluate": {"x": val_ds}}


def build(optimizer: str = "program") -> keras.Model:
    feature_space = _feature_space_and_datasets()[0]
    keras.utils.set_random_seed(5)
    encoded_features = feature_space.get_encoded_features()
    x = keras.layers.Dense(32, activation="relu")(encoded_features)
    x = keras.layers.Dropout(0.0)(x)
    predictions = keras.layers.Dense(1, activation="sigmoid")(x)
    training_model = keras.Model(inputs=encoded_features, outputs=predictions)
    training_model.compile(
        optimizer="adam" if optimizer == "program" else keras.optimizers.SGD(0.05),
        loss="binary_crossentropy", metrics=["accuracy"])
    return training_model
