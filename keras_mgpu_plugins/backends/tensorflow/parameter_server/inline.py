"""`evaluate` and `predict` of a parameter-server model: Keras's own, run on the chief.

The chief reads the variables from the parameter servers and computes there itself,
under TensorFlow's default strategy (`patches.parameter_server.OnTheChief`): every row is
read exactly once, in order, as on one device, with every Keras argument and callback.
Workers take no part (their steps would read the rows in no set order, and a lost one's
rows twice). `fit` evaluates `validation_data` the same way, between epochs.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches import ps_trainer as _private


def evaluate(model: Any, keras_evaluate: Any, x: Any = None, *args: Any, **kwargs: Any) -> Any:
    """`keras.Model.evaluate` of a parameter-server model, on the chief."""
    import tensorflow as tf

    if callable(x) and not isinstance(x, tf.data.Dataset) and not hasattr(x, "shape"):
        x = x()  # a dataset function, as fit takes: called once, on the chief
    _build(model, x, args, kwargs)
    with _private.OnTheChief(model):
        return keras_evaluate(model, x, *args, **kwargs)


def predict(model: Any, keras_predict: Any, *args: Any, **kwargs: Any) -> Any:
    """`keras.Model.predict` of a parameter-server model, on the chief."""
    with _private.OnTheChief(model):
        return keras_predict(model, *args, **kwargs)


def test_on_batch(model: Any, keras_method: Any, *args: Any, **kwargs: Any) -> Any:
    """`keras.Model.test_on_batch` of a parameter-server model, on the chief."""
    with _private.OnTheChief(model):
        return keras_method(model, *args, **kwargs)


def predict_on_batch(model: Any, keras_method: Any, *args: Any, **kwargs: Any) -> Any:
    """`keras.Model.predict_on_batch` of a parameter-server model, on the chief."""
    with _private.OnTheChief(model):
        return keras_method(model, *args, **kwargs)


def _build(model: Any, x: Any, args: tuple, kwargs: dict) -> None:
    """The compiled metrics' variables on the parameter servers, as fit makes them, so that
    an evaluate before any fit does not make them on the chief."""
    import keras
    import tensorflow as tf

    y = kwargs.get("y", args[0] if args else None)
    if isinstance(x, tf.data.Dataset):
        element = x.element_spec
    elif x is not None and all(hasattr(a, "shape") for a in keras.tree.flatten(x)):
        batch = kwargs.get("batch_size") or 32
        element = tuple(keras.tree.map_structure(lambda a: a[:batch], v)
                        for v in (x, y) if v is not None)
    else:
        return  # Keras builds what is missing as it would on one device
    _private.build_in_scope(model, _private.strategy_of(model), element)
