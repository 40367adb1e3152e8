"""`@kmp.parallelize(random_layers="one_device")`: random layers draw one device's numbers.

On one device a Dropout (GaussianNoise, a random augmentation layer) draws its numbers for
the whole batch from its seed; on N replicas (TensorFlow) or N processes (torch) each
draws for its own rows from the same seed: other numbers, so N devices train otherwise
than one device. With this option each draw a random layer makes in a distributed step is
made for the global batch, as one device makes it, and the replica keeps its rows:

- the layers that own a Keras `SeedGenerator` get a `call` that notes their batch's rows
  (the registered per-instance change `random_layer_rows`);
- the backend's random functions (`keras.src.backend.random`: `uniform`, `normal`,
  `truncated_normal`, `randint`, `dropout`; the registered change
  `random_draws_as_one_device`), called inside such a layer with the batch's rows first,
  draw for the global batch and return the replica's rows. Where the replica's rows start
  and how many rows the global batch has is the backend's primitive, `row_span(rows)`:
  an all-gather of the replicas' row counts (TensorFlow: in the replica context; torch:
  over the process group), or `None` outside a distributed step (one device: nothing
  changes). JAX draws over the global batch already (its arrays are global): `None`.

The other random functions (`categorical`, `shuffle`, `gamma`, `binomial`, `beta`) draw as
before; a random layer's draw through one of them is noted (`UNCOVERED`). Each draw in a
distributed step costs one small all-gather and a draw N times larger.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

from keras_mgpu_plugins import _backend

#: The name Keras gives a `SeedGenerator`'s state variable.
SEED_STATE = "seed_generator_state"

#: The option's values.
MODES = ("per_replica", "one_device")
_SHAPED = ("uniform", "normal", "truncated_normal", "randint")
_OTHERS = ("categorical", "shuffle", "gamma", "binomial", "beta")
#: Random layers that drew through a function kmp cannot draw as one device (names).
UNCOVERED: list[str] = []
#: kmp-verify's noise run: each batch's rows come reversed, and each random layer's draws
#: are reversed with them, so every row keeps the numbers it draws in the other runs.
REVERSED: list[bool] = [False]
#: The layers that draw one device's numbers (the others only note their rows).
ONE_DEVICE: weakref.WeakSet = weakref.WeakSet()
_local = threading.local()


def check(mode: Any) -> None:
    if mode not in MODES:
        raise ValueError(f"random_layers must be one of {list(MODES)}. Received: "
                         f"random_layers={mode!r}")


def random_layers(model: Any) -> list[dict[str, Any]]:
    """The layers that own a Keras `SeedGenerator` (Dropout, GaussianNoise, the random
    augmentation layers, a user's layer with one), with their class and rate."""
    from keras_mgpu_plugins import compat

    found = []
    for layer in compat.all_layers(model):
        inner = {id(v) for sub in compat.all_layers(layer) if sub is not layer
                 for v in sub.variables}
        own = [v for v in layer.variables
               if getattr(v, "name", "").endswith(SEED_STATE) and id(v) not in inner]
        if own:
            rate = getattr(layer, "rate", None)
            found.append({"layer": layer.name, "class": type(layer).__name__,
                          "draws": rate is None or float(rate) > 0})
    return found


def draw_as_one_device(model: Any, one_device: bool = True) -> Any:
    """Makes `model`'s random layers draw one device's numbers (see the module docstring);
    returns the model. Applies `random_draws_as_one_device` once per process, and
    `random_layer_rows` to each layer owning a `SeedGenerator`. With `one_device=False`
    (kmp-verify's runs of a script whose layers draw per replica) the layers only note
    their rows, for the noise run (`REVERSED`)."""
    from keras_mgpu_plugins import compat

    compat._registry.apply("random_draws_as_one_device")
    names = {entry["layer"] for entry in random_layers(model)}
    for layer in compat.all_layers(model):
        if layer.name in names and "random_layer_rows" not in compat.applied_on(layer):
            compat.apply_to("random_layer_rows", layer)
        if layer.name in names and one_device:
            ONE_DEVICE.add(layer)
    model.train_function = None
    return model


def draws_as_one_device(layer: Any) -> bool:
    return layer in ONE_DEVICE


def note_rows(layer: Any) -> None:
    """The per-instance change `random_layer_rows`: `layer.call` notes its batch's rows."""
    call = layer.call

    from keras_mgpu_plugins.verify import _config

    run = _config.current()
    off = run is not None and layer.name in run.random_off

    @functools.wraps(call)
    def noted(*args: Any, **kwargs: Any) -> Any:
        import keras

        first = args[0] if args else next(iter(kwargs.values()), None)
        if off:  # kmp-verify: a layer kmp cannot make draw as one device, turned off
            return first
        leaves = [t for t in keras.tree.flatten(first) if getattr(t, "shape", None)]
        stack = getattr(_local, "stack", None) or []
        _local.stack = stack
        stack.append((layer.name, keras.ops.shape(leaves[0])[0] if leaves else None,
                      layer in ONE_DEVICE))
        try:
            return call(*args, **kwargs)
        finally:
            stack.pop()

    layer.call = noted


def wrap_backend_random() -> Any:
    """The change `random_draws_as_one_device`; returns the undo."""
    from keras_mgpu_plugins.compat._names import resolve

    return wrap_random(resolve("backend random module"))


def wrap_random(module: Any) -> Any:
    """The change `random_draws_as_one_device` on the backend's random module; the undo."""
    from keras_mgpu_plugins.compat._record import replace

    undo = [replace(module, name, _shaped(getattr(module, name))) for name in _SHAPED]
    undo.append(replace(module, "dropout", _dropout(module.dropout)))
    undo += [replace(module, name, _noted(getattr(module, name)))
             for name in _OTHERS if hasattr(module, name)]
    return lambda: [u() for u in reversed(undo)]


def _inside() -> tuple[str, Any, bool] | None:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def _span(first: Any) -> tuple[Any, Any, Any] | None:
    """`(offset, total, rows)` when a random layer draws for its batch in a distributed
    step with `first` (the draw's leading size) its batch's rows, else `None`."""
    inside = _inside()
    if inside is None or inside[1] is None or not inside[2]:
        return None
    rows = inside[1]
    if isinstance(first, int) and isinstance(rows, int) and first != rows:
        return None  # not the batch's axis
    span = _backend.active().row_span(rows)
    return None if span is None else (*span, rows)


def _flipping(first: Any) -> bool:
    """In the noise run, whether a draw of leading size `first` is the batch's."""
    inside = _inside()
    if not REVERSED[0] or inside is None or inside[1] is None:
        return False
    rows = inside[1]
    return not (isinstance(first, int) and isinstance(rows, int) and first != rows)


def _flip(tensor: Any) -> Any:
    import keras

    return keras.ops.flip(tensor, axis=0)


def _shaped(original: Any) -> Any:
    @functools.wraps(original)
    def draw(shape: Any, *args: Any, **kwargs: Any) -> Any:
        dims = tuple(shape) if shape is not None else ()
        if dims and _flipping(dims[0]):
            return _flip(original(shape, *args, **kwargs))
        span = _span(dims[0]) if dims else None
        if span is None:
            return original(shape, *args, **kwargs)
        offset, total, rows = span
        return original((total, *dims[1:]), *args, **kwargs)[offset:offset + rows]

    return draw


def _dropout(original: Any) -> Any:
    @functools.wraps(original)
    def dropout(inputs: Any, rate: Any, noise_shape: Any = None, seed: Any = None) -> Any:
        import keras

        if _flipping(keras.ops.shape(inputs)[0]):
            return _flip(original(_flip(inputs), rate, noise_shape=noise_shape, seed=seed))
        span = None if isinstance(rate, (int, float)) and rate in (0, 1) else _span(
            keras.ops.shape(inputs)[0])
        if span is None:
            return original(inputs, rate, noise_shape=noise_shape, seed=seed)
        offset, total, rows = span
        if noise_shape is not None and noise_shape[0] not in (None, 1):
            noise_shape = (None, *tuple(noise_shape)[1:])  # the (global) batch's rows
        rest = tuple(keras.ops.shape(inputs)[1:])
        whole = keras.ops.concatenate(
            [keras.ops.zeros((offset, *rest), inputs.dtype), inputs,
             keras.ops.zeros((total - offset - rows, *rest), inputs.dtype)], axis=0)
        return original(whole, rate, noise_shape=noise_shape, seed=seed)[offset:offset + rows]

    return dropout


def _noted(original: Any) -> Any:
    @functools.wraps(original)
    def draw(*args: Any, **kwargs: Any) -> Any:
        inside = _inside()
        if inside is not None and inside[2] and inside[0] not in UNCOVERED:
            UNCOVERED.append(inside[0])
        return original(*args, **kwargs)

    return draw
