"""The changes kmp-verify and `@kmp.parallelize(random_layers="one_device")` make to Keras
objects (`kind="feature"`), appended to `compat._features.FEATURES` after the torch lane's
(the verify wrapper of `fit` is the outermost of all)."""

from __future__ import annotations

import dataclasses

from keras_mgpu_plugins.compat._checks import CHECKED_BELOW
from keras_mgpu_plugins.compat._record import Patch, lazy

_MIN, _MAX = "3.10.0", CHECKED_BELOW["keras"]


def _has(path: str) -> bool:
    from keras_mgpu_plugins.compat._checks import resolve

    try:
        return callable(resolve(path))
    except AttributeError:
        return False


def _fit_takes(*names: str) -> bool:
    import inspect

    import keras

    return all(n in inspect.signature(keras.Model.fit).parameters for n in names)


def _feature(name: str, apply: str, symptom: str, wraps: tuple[str, ...], when: str,
             present: object, upstream: str, after: tuple[str, ...] = (),
             per_instance: bool = False) -> Patch:
    module, function = apply.rsplit(":", 1)
    return Patch(name=name, upstream=upstream, min_version=_MIN, max_version=_MAX,
                 apply=lazy(module, function), present=present, changes_results=False,
                 symptom=symptom, wraps=wraps, after=after, kind="feature", when=when,
                 per_instance=per_instance)


_TRAINER = "https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/trainer.py"
_VERIFY_WHEN = "in the processes of a kmp-verify run (kmp.verify), once Keras is imported"
#: kmp-verify's (`keras_mgpu_plugins.verify`): outside every other wrapper of these methods,
#: so it sees the script's own arguments (the torch lane's record is the outermost before it).
VERIFY_FEATURES: tuple[Patch, ...] = (
    _feature(
        "verify_records_calls", "keras_mgpu_plugins.verify._hooks:wrap_methods",
        "kmp-verify cannot compare one device with N: the first fit's steps, its data's "
        "fingerprint, evaluate and predict are not recorded",
        ("keras.Model.fit", "keras.Model.evaluate", "keras.Model.predict"), _VERIFY_WHEN,
        lambda: _fit_takes("callbacks", "x", "batch_size"), upstream=_TRAINER,
        after=("same_calls_on_every_worker", "torch_one_model_per_job",
               "parameter_server_methods")),
    _feature(
        "verify_noise_rows_reversed", "keras_mgpu_plugins.verify._hooks:reverse_rows",
        "kmp-verify has no measure of the script's float noise (its noise run trains each "
        "batch with its rows in the same order)", ("keras.Model.train_step",),
        "the first fit of kmp-verify's noise run (one device), on the fitted model",
        lambda: _has("keras.Model.train_step"), upstream=_TRAINER,
        after=("placed_train_step", "torch_steps_as_one_device"), per_instance=True),
)

_RANDOM_WHEN = ("@kmp.parallelize(random_layers=\"one_device\") (and every run of kmp-verify), "
                "on the models it builds")
#: `@kmp.parallelize(random_layers="one_device")` (`keras_mgpu_plugins._random_layers`).
RANDOM_FEATURES: tuple[Patch, ...] = (
    dataclasses.replace(_feature(
        "random_draws_as_one_device", "keras_mgpu_plugins._random_layers:wrap_backend_random",
        "Dropout, GaussianNoise and the random augmentation layers draw other numbers on N "
        "replicas (TensorFlow) or N processes (torch) than one device draws for the same "
        "rows: N devices train otherwise than one device",
        tuple(f"backend random module.{n}" for n in ("uniform", "normal", "truncated_normal",
                                                    "randint", "dropout")),
        _RANDOM_WHEN, lambda: _has("keras.random.uniform"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/backend/"
                 "tensorflow/random.py"), changes_results=True),
    _feature(
        "random_layer_rows", "keras_mgpu_plugins._random_layers:note_rows",
        "random_layers=\"one_device\" cannot tell a random layer's batch from its other "
        "draws", ("keras.layers.Layer.call",), _RANDOM_WHEN,
        lambda: _has("keras.layers.Layer.call"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/layers/layer.py",
        after=("placed_layer_call",), per_instance=True),
)

