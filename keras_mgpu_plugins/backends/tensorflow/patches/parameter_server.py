"""The changes kmp makes to Keras for parameter-server training (`kmp.compat` records).

- `parameter_server_methods` (keras-team/keras#18624): Keras 3's `Model.fit`,
  `evaluate` and `predict` cannot run under `ParameterServerStrategy` (its datasets
  must be made per worker by a `ClusterCoordinator`). For a model built in such a
  strategy's scope, kmp's own loop runs instead (`parameter_server.fit`: the model's
  `train_step` sent to the workers through the coordinator, Keras's `CallbackList`
  on the chief) and `evaluate`/`predict` run on the chief itself
  (`parameter_server.inline`). Every other model goes to Keras's methods untouched.
- `atomic_variable_updates`: Keras's `Variable.assign_add`/`assign_sub` are
  `self.assign(self + value)`: a read, then a write. Workers that update one variable
  on a parameter server at the same time overwrite each other's updates, so
  `optimizer.iterations` and every metric's totals count fewer steps than ran
  (measured: 1248 of 2000 steps counted with 2 workers). On TensorFlow, kmp makes them
  the variable's own `assign_add`/`assign_sub` (one atomic operation), as the
  optimizer already does for the weights (`TFOptimizer.assign_add`).
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve

#: The methods kmp runs itself for a model of a `ParameterServerStrategy`.
METHODS = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")


def wrap_methods() -> Any:
    """`keras.Model.fit` & co. dispatch a parameter-server model to kmp's loop. Returns the undo."""
    import keras

    from keras_mgpu_plugins.backends.tensorflow.parameter_server import fit as ps_fit
    from keras_mgpu_plugins.backends.tensorflow.parameter_server import inline

    originals = {name: keras.Model.__dict__.get(name) for name in METHODS}
    replacements = {"fit": ps_fit.fit, "train_on_batch": ps_fit.train_on_batch,
                    "evaluate": inline.evaluate, "predict": inline.predict,
                    "test_on_batch": inline.test_on_batch,
                    "predict_on_batch": inline.predict_on_batch}

    def dispatch(name: str) -> Any:
        keras_method = getattr(keras.Model, name)
        ours = replacements[name]

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _is_parameter_server_model(self):
                return ours(self, keras_method, *args, **kwargs)
            return keras_method(self, *args, **kwargs)

        method.__name__ = method.__qualname__ = name
        method.__doc__ = keras_method.__doc__
        method.__wrapped__ = keras_method  # type: ignore[attr-defined]
        return method

    for name in METHODS:
        setattr(keras.Model, name, dispatch(name))

    def undo() -> None:
        for name, original in originals.items():
            if original is None:
                delattr(keras.Model, name)
            else:
                setattr(keras.Model, name, original)

    return undo


def _is_parameter_server_model(model: Any) -> bool:
    from keras_mgpu_plugins.backends.tensorflow.parameter_server.cluster import (
        is_parameter_server,
    )
    from keras_mgpu_plugins.backends.tensorflow.patches.ps_trainer import strategy_of

    return is_parameter_server(strategy_of(model))


def keras_methods_there() -> bool:
    """Whether `keras.Model` still has every method `wrap_methods` dispatches."""
    import keras

    return all(callable(getattr(keras.Model, name, None)) for name in METHODS)


def patch_atomic_updates() -> Any:
    """`Variable.assign_add`/`assign_sub` on TensorFlow: one atomic update of the variable."""
    in_stateless_scope = resolve("stateless scope module").in_stateless_scope
    cls = resolve("tensorflow variable")
    originals = {name: cls.__dict__.get(name) for name in ("assign_add", "assign_sub")}

    def atomic(name: str) -> Any:
        keras_method = getattr(cls, name)

        def method(self: Any, value: Any) -> Any:
            variable = getattr(self, "_value", None)
            if in_stateless_scope() or not hasattr(variable, name):
                return keras_method(self, value)
            value = self._convert_to_tensor(value, dtype=self._dtype)
            if tuple(value.shape) != tuple(self.shape):  # broadcast, or Keras's own error
                return keras_method(self, value)
            import tensorflow as tf

            return getattr(variable, name)(tf.cast(value, variable.dtype))

        method.__name__ = method.__qualname__ = name
        method.__wrapped__ = keras_method  # type: ignore[attr-defined]
        return method

    for name in originals:
        setattr(cls, name, atomic(name))

    def undo() -> None:
        for name, original in originals.items():
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)

    return undo


def updates_read_then_write() -> bool | None:
    """Whether Keras's `Variable.assign_add` is still `self.assign(self + value)`."""
    return source_has(resolve("common variable").assign_add, "self.assign(self + value)")
