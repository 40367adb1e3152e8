"""The arguments of `fit`/`evaluate`/`predict` arranged so each process feeds its share.

Users pass the same global arrays (numpy, or dicts/lists/tuples of them), the global
`batch_size` and `validation_data` on every process. With several processes each is
replaced by a `PyDataset` of this process's part of every global batch (`inputs.batches`;
`inputs.streams` for a `PyDataset`, a generator, a `tf.data` or grain dataset or a
`DataLoader`), `shuffle` by kmp's shared permutation, `validation_split` by the last rows
of the global arrays, as Keras takes them. Each function arranges, in place, the
arguments of one method, read as Keras's own `Model.fit` defines them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from keras_mgpu_plugins import _data_order
from keras_mgpu_plugins.inputs import batches, streams

_FIT_DEFAULT_BATCH = 32  # Keras's batch size when none is given (arrays)


def fit_arguments(arguments: dict[str, Any], sharing: Any) -> None:
    _data_order.register(None)  # not a former fit's order: this fit's registers below, if any
    several = sharing.several
    batch = arguments["batch_size"] or _FIT_DEFAULT_BATCH
    if several and streams.kind(arguments["x"]):
        arguments["x"] = streams.shared(arguments["x"], "fit(x=...)", sharing,
                                        arguments["shuffle"])
        arguments["shuffle"] = False  # a PyDataset's batch order: permuted by kmp, shared
        _validation(arguments, batch, sharing)
        return
    split = arguments["validation_split"]
    if several and split and arguments["validation_data"] is None:
        x, y, weights, arguments["validation_data"] = _split(
            arguments["x"], arguments["y"], arguments["sample_weight"], split)
        arguments.update(x=x, y=y, sample_weight=weights, validation_split=0.0)
    arrays = _arrays(arguments, ("x", "y", "sample_weight"), batch, sharing, "fit")
    _validation(arguments, batch, sharing)
    if several and arrays:  # one order of the global rows per epoch, on every process
        arguments.update(x=batches.global_batches(arrays, batch, arguments["shuffle"], sharing),
                         y=None, sample_weight=None, shuffle=False, batch_size=None)


def _validation(arguments: dict[str, Any], batch: int, sharing: Any) -> None:
    data = arguments["validation_data"]
    if data is None:
        return
    vbatch = arguments["validation_batch_size"] or batch
    if sharing.several and streams.kind(data):
        arguments["validation_data"] = streams.shared(data, "fit(validation_data=...)",
                                                      sharing, False)
        return
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        if sharing.several:
            _refuse("validation_data", data)
        return
    names = ("x", "y", "sample_weight")[: len(data)]
    parts = dict(zip(names, data, strict=True))
    arrays = _arrays(parts, names, vbatch, sharing, "validation_data")
    if sharing.several and arrays:
        arguments["validation_data"] = batches.global_batches(arrays, vbatch, False, sharing)
        arguments["validation_batch_size"] = None


def evaluate_arguments(arguments: dict[str, Any], sharing: Any) -> None:
    _one_pass(arguments, ("x", "y", "sample_weight"), sharing, "evaluate")


def predict_arguments(arguments: dict[str, Any], sharing: Any) -> None:
    _one_pass(arguments, ("x",), sharing, "predict")


def _one_pass(arguments: dict[str, Any], names: tuple[str, ...], sharing: Any,
              method: str) -> None:
    if sharing.several and streams.kind(arguments["x"]):
        arguments["x"] = streams.shared(arguments["x"], f"{method}(x=...)", sharing, False)
        return
    batch = arguments["batch_size"] or _FIT_DEFAULT_BATCH
    arrays = _arrays(arguments, names, batch, sharing, method)
    if sharing.several and arrays:
        arguments.update(x=batches.global_batches(arrays, batch, False, sharing),
                         batch_size=None, **{n: None for n in names[1:]})


def _arrays(arguments: dict[str, Any], names: tuple[str, ...], batch: int, sharing: Any,
            method: str) -> tuple | None:
    """Checks the global arrays of `names`; with several processes, returns them (`None`
    where absent) for `batches.global_batches`, else `None`."""
    import keras

    several = sharing.several
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
    if total > batch:
        sharing.warn_if_never_divides(batch, method)
    for size in ([batch] if total >= batch else []) + ([total % batch] if total % batch else []):
        sharing.check_rows(size, f"{method} ({total} rows, batch_size={batch})")
    if not several:
        return None
    return tuple(arguments.get(n) for n in names) + (None,) * (3 - len(names))


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
        "shares of each global batch by kmp on several processes (every process would feed "
        "its own batches, not one device's). Pass numpy arrays (or dicts/lists of them), the "
        "same global arrays on every process, with the global batch_size; or the same "
        "keras.utils.PyDataset, generator, tf.data.Dataset, grain dataset or "
        "torch.utils.data.DataLoader on every process, yielding the global batches.")
