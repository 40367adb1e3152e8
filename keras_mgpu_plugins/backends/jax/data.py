"""Inputs as on one device, for the models `@kmp.parallelize` builds on JAX.

Users pass the same global arrays (numpy, or dicts/lists/tuples of them), the
global `batch_size` and `validation_data` to `fit`/`evaluate`/`predict` on every
process. With `P` processes, process `p` is fed rows `[p*b, (p+1)*b)` of every
global batch of `B = P*b` rows; Keras (`auto_shard_dataset=False`) assembles the
processes' shares into one global batch (`jax.make_array_from_process_local_data`),
the very batch one device trains on, so training equals one device. A batch whose
rows do not divide over the devices (a last batch, or `batch_size` itself) is fed
whole to every device (`backends.jax.batches`). `predict` returns every row once,
in order, on every process.

A `keras.utils.PyDataset`, a generator, a `tf.data.Dataset` or a grain dataset, the
same on every process, is fed the same way (`backends.jax.streams`). `shuffle=True`
(fit's default) and `"batch"` shuffle the global rows the same way on every process
(`backends.jax.shuffle`).

Each function arranges the arguments of one method (read as Keras's own `Model.fit`
defines them) in place, under the model's distribution (`backends.jax.methods`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from keras_mgpu_plugins.backends.jax import batches, streams
from keras_mgpu_plugins.backends.jax.shuffle import share_rows  # noqa: F401 - and data.share_rows

_FIT_DEFAULT_BATCH = 32  # Keras's batch size when none is given (arrays)


def _several() -> bool:
    import jax

    return jax.process_count() > 1


def fit_arguments(arguments: dict[str, Any], distribution: Any, partial: bool) -> None:
    several = _several()
    batch = arguments["batch_size"] or _FIT_DEFAULT_BATCH
    if several and streams.kind(arguments["x"]):
        arguments["x"] = streams.shared(arguments["x"], "fit(x=...)", distribution,
                                        arguments["shuffle"], partial)
        arguments["shuffle"] = False  # a PyDataset's batch order: permuted by kmp, shared
        _validation(arguments, batch, distribution, partial)
        return
    split = arguments["validation_split"]
    if several and split and arguments["validation_data"] is None:
        x, y, weights, arguments["validation_data"] = _split(
            arguments["x"], arguments["y"], arguments["sample_weight"], split)
        arguments.update(x=x, y=y, sample_weight=weights, validation_split=0.0)
    arrays = _arrays(arguments, ("x", "y", "sample_weight"), batch, distribution, "fit",
                     partial)
    _validation(arguments, batch, distribution, partial)
    if several and arrays:  # one order of the global rows per epoch, on every process
        arguments.update(x=batches.global_batches(arrays, batch, arguments["shuffle"],
                                                  distribution),
                         y=None, sample_weight=None, shuffle=False, batch_size=None)


def _validation(arguments: dict[str, Any], batch: int, distribution: Any, partial: bool) -> None:
    data = arguments["validation_data"]
    if data is None:
        return
    several = _several()
    vbatch = arguments["validation_batch_size"] or batch
    if several and streams.kind(data):
        arguments["validation_data"] = streams.shared(data, "fit(validation_data=...)",
                                                      distribution, False, partial)
        return
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        if several:
            _refuse("validation_data", data)
        return
    names = ("x", "y", "sample_weight")[: len(data)]
    parts = dict(zip(names, data, strict=True))
    arrays = _arrays(parts, names, vbatch, distribution, "validation_data", partial)
    if several and arrays:
        arguments["validation_data"] = batches.global_batches(arrays, vbatch, False,
                                                              distribution)
        arguments["validation_batch_size"] = None


def evaluate_arguments(arguments: dict[str, Any], distribution: Any, partial: bool) -> None:
    _one_pass(arguments, ("x", "y", "sample_weight"), distribution, partial, "evaluate")


def predict_arguments(arguments: dict[str, Any], distribution: Any, partial: bool) -> None:
    _one_pass(arguments, ("x",), distribution, partial, "predict")


def _one_pass(arguments: dict[str, Any], names: tuple[str, ...], distribution: Any,
              partial: bool, method: str) -> None:
    if _several() and streams.kind(arguments["x"]):
        arguments["x"] = streams.shared(arguments["x"], f"{method}(x=...)", distribution,
                                        False, partial)
        return
    batch = arguments["batch_size"] or _FIT_DEFAULT_BATCH
    arrays = _arrays(arguments, names, batch, distribution, method, partial)
    if _several() and arrays:
        arguments.update(x=batches.global_batches(arrays, batch, False, distribution),
                         batch_size=None, **{n: None for n in names[1:]})


def _arrays(arguments: dict[str, Any], names: tuple[str, ...], batch: int, distribution: Any,
            method: str, partial: bool) -> tuple | None:
    """Checks the global arrays of `names` against the distribution; with several processes,
    returns them (`None` where absent) for `batches.global_batches`, else `None`."""
    import keras

    several = _several()
    leaves = {n: keras.tree.flatten(arguments[n]) for n in names if arguments.get(n) is not None}
    for name, values in leaves.items():
        for value in values:
            if not hasattr(value, "shape") or not getattr(value, "shape", ()):
                if not several:
                    return None  # one process: Keras assembles the global batch itself
                _refuse(f"{method}({name}=...)", arguments[name])
    rows = {int(v.shape[0]) for values in leaves.values() for v in values}
    if len(rows) != 1:
        return None  # no arrays, or Keras raises its own error for different lengths
    total = rows.pop()
    _check_divisible(total, batch, distribution, method, partial)
    if not several:
        return None
    return tuple(arguments.get(n) for n in names) + (None,) * (3 - len(names))


def _check_divisible(total: int, batch: int, distribution: Any, method: str,
                     partial: bool) -> None:
    """Where the installed Keras lets kmp feed a batch whole (`partial`): one warning when
    `batch_size` never divides; else the batches that cannot be split are refused."""
    devices = batches.axis_size(distribution)
    if partial:
        if total > batch:
            batches.warn_if_never_divides(batch, distribution, method)
        return
    sizes = ([batch] if total >= batch else []) + ([total % batch] if total % batch else [])
    odd = [size for size in sizes if size % devices]
    if odd:
        raise ValueError(
            f"{method}: a batch of {odd[0]} rows ({total} rows, batch_size={batch}) does "
            f"not divide over the {devices} devices of the distribution, and the installed "
            "Keras does not let kmp feed such a batch whole to every device (kmp.compat."
            "report(): jax_partial_batches_replicated). Pass rows and a batch_size that are "
            f"multiples of {devices}.")


def _split(x: Any, y: Any, weights: Any, split: float) -> tuple:
    """Keras's `validation_split` on the global arrays: the last `split` of the rows."""
    import keras

    total = int(keras.tree.flatten(x)[0].shape[0])
    at = int(math.floor(total * (1.0 - split)))

    def cut(tree: Any, part: slice) -> Any:
        return None if tree is None else keras.tree.map_structure(
            lambda a: np.asarray(a)[part], tree)

    train = (cut(x, slice(0, at)), cut(y, slice(0, at)), cut(weights, slice(0, at)))
    held = tuple(t for t in (cut(x, slice(at, None)), cut(y, slice(at, None)),
                             cut(weights, slice(at, None))) if t is not None)
    return (*train, held)


def _refuse(what: str, value: Any) -> None:
    raise ValueError(
        f"{what}: an input of type {type(value).__name__} cannot be split into the processes' "
        "shares of each global batch by kmp on several JAX processes (every process would feed "
        "its own batches, not one device's). Pass numpy arrays (or dicts/lists of them), the "
        "same global arrays on every process, with the global batch_size; or the same "
        "keras.utils.PyDataset, generator, tf.data.Dataset or grain dataset on every process, "
        "yielding the global batches.")


