"""Inside each process of a verify run: what kmp adds to the script's `fit`, `evaluate`
and `predict`, and what it sets up before the script starts.

`install(config)` runs in the launcher's worker bootstrap (`run.prepare`) before the
script: it notes the random sources the script reads (`_sources`), seeds Python's `random`
and NumPy's generator, and once Keras is imported seeds Keras and its backend
(`keras.utils.set_random_seed`), splits the devices as the run says, and wraps
`keras.Model.fit` / `evaluate` / `predict` (the registered change `verify_records_calls`,
outside every other wrapper of those methods, so it sees the script's own arguments).

The first `fit` gets a `Recorder`, its data's fingerprint and its settings are noted,
and in the noise run each training batch's rows are reversed (`reverse_rows`, the
registered per-instance change `verify_noise_rows_reversed`). The first `evaluate` gets a
`TestRecorder`, the first `predict`'s outputs are kept. A `fit` on a model that
`@kmp.parallelize` did not build is noted (the run cannot be compared).
"""

from __future__ import annotations

import functools
import inspect
import random
from typing import Any

from keras_mgpu_plugins.verify import _config

_state: dict[str, Any] = {}


def install(config: _config.Config) -> None:
    """Prepares this process for its run (see the module docstring). Idempotent."""
    if _state:
        return
    from keras_mgpu_plugins._after_import import when_imported
    from keras_mgpu_plugins.verify import _sources

    _state["config"] = config
    _sources.install()
    import numpy as np

    random.seed(config.seed)
    np.random.seed(config.seed)
    when_imported("keras", lambda keras: _after_keras(keras, config))


def _after_keras(keras: Any, config: _config.Config) -> None:
    from keras_mgpu_plugins import compat
    from keras_mgpu_plugins.devices import simulate_devices

    if config.workers == 1 and keras.backend.backend() != "torch":
        simulate_devices(config.devices)  # before the backend's runtime starts
    keras.utils.set_random_seed(config.seed)
    compat._registry.apply("verify_records_calls")


def record() -> Any:
    """This process's record (made at the first call)."""
    from keras_mgpu_plugins.verify._recorder import Record

    if "record" not in _state:
        _state["record"] = Record(_state["config"])
    return _state["record"]


def wrap_methods() -> Any:
    """The registered change `verify_records_calls`: `keras.Model.fit`, `evaluate` and
    `predict` recorded as above; returns the undo."""
    import keras

    from keras_mgpu_plugins.compat._record import replace

    undo = [replace(keras.Model, name, wrapper(name, getattr(keras.Model, name)))
            for name in ("fit", "evaluate", "predict")]
    return lambda: [u() for u in reversed(undo)]


def wrapper(name: str, original: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_use_cached_eval_dataset") or _state.get("inside") or \
                _config.building():  # fit's own validation, nested, or in a kmp factory
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        _state["inside"] = True
        try:
            if name == "fit":
                return _fit(self, bound, original)
            if name == "evaluate":
                return _evaluate(self, bound, original)
            return _predict(self, bound, original)
        finally:
            _state["inside"] = False

    return method


def _fit(model: Any, bound: inspect.BoundArguments, original: Any) -> Any:
    record_ = record()
    record_.data["fit_calls"] += 1
    config = _state["config"]
    if len(record_.data["fits"]) >= config.fits or record_.data["undecorated"]:
        return original(*bound.args, **bound.kwargs)
    if not _config.built_by_kmp(model):
        record_.data["undecorated"].append(f"{type(model).__name__} {model.name!r}")
        record_.write(None)
        return original(*bound.args, **bound.kwargs)
    from keras_mgpu_plugins.inputs import streams
    from keras_mgpu_plugins.verify import _fingerprint, _order
    from keras_mgpu_plugins.verify._recorder import Recorder, new_fit

    fit = new_fit()
    record_.data["fits"].append(fit)
    arguments = bound.arguments
    fit["fingerprint"], arguments["x"] = _fingerprint.of_input(arguments.get("x"))
    rest = {k: arguments.get(k) for k in ("y", "sample_weight", "validation_data")}
    fit["settings"] = {
        "others": _fingerprint.of_arrays(rest),
        **{k: _setting(arguments.get(k)) for k in ("batch_size", "epochs", "shuffle",
                                                   "validation_split", "steps_per_epoch",
                                                   "initial_epoch", "class_weight")}}
    note = _order.fix(arguments, config.seed, streams.kind(arguments["x"]) is not None)
    if note:
        fit["notes"].append(note)
    if config.run == "noise":
        from keras_mgpu_plugins import compat

        compat.apply_to("verify_noise_rows_reversed", model)
    callbacks = list(arguments.get("callbacks") or [])
    arguments["callbacks"] = [*callbacks, Recorder(record_, fit, config.steps)]
    try:
        return original(*bound.args, **bound.kwargs)
    finally:
        if config.run == "noise":
            from keras_mgpu_plugins import compat

            compat.remove_from("verify_noise_rows_reversed", model)
            model.train_function = None  # (built with the rows reversed)


def _setting(value: Any) -> Any:
    return value if value is None or isinstance(value, (int, float, bool, str)) else repr(value)


def _last_fit() -> dict | None:
    """The compared fit the next evaluate / predict belongs to (`None`: none yet)."""
    fits = record().data["fits"]
    return fits[-1] if fits and fits[-1]["steps"] else None


def _evaluate(model: Any, bound: inspect.BoundArguments, original: Any) -> Any:
    fit = _last_fit()
    if fit is None or fit["evaluate"] is not None:
        return original(*bound.args, **bound.kwargs)
    from keras_mgpu_plugins.verify._recorder import TestRecorder

    callbacks = list(bound.arguments.get("callbacks") or [])
    bound.arguments["callbacks"] = [*callbacks, TestRecorder(fit)]
    result = original(*bound.args, **bound.kwargs)
    record().write(model)
    return result


def _predict(model: Any, bound: inspect.BoundArguments, original: Any) -> Any:
    fit = _last_fit()
    result = original(*bound.args, **bound.kwargs)
    if fit is not None and fit["predict"] is None:
        from keras_mgpu_plugins.verify._recorder import predictions

        fit["predict"] = predictions(result)
        record().write(model)
    return result


def reverse_rows(model: Any) -> None:
    """The registered per-instance change `verify_noise_rows_reversed`: the model's
    `train_step` takes each batch with its rows in the opposite order (the noise run: the
    same sums in another order, as N replicas' all-reduce reorders them)."""
    from keras_mgpu_plugins import _random_layers

    step = model.train_step

    def train_step(*args: Any) -> Any:
        _random_layers.REVERSED[0] = True  # each row keeps its random numbers (traced here)
        try:
            return step(*args[:-1], _reversed(args[-1]))
        finally:
            _random_layers.REVERSED[0] = False

    model.train_step = train_step
    model.train_function = None


def _reversed(data: Any) -> Any:
    import keras

    def flip(tensor: Any) -> Any:
        shape = getattr(tensor, "shape", None)
        if shape is None or len(shape) == 0:
            return tensor
        return keras.ops.flip(tensor, axis=0)

    return keras.tree.map_structure(flip, data)
