"""One order of the training rows for every run of a verification.

`fit(shuffle=True)` (Keras's default) shuffles otherwise on one process (Keras's own
shuffle) than on several (kmp's shared permutation of the global rows): the runs would
train on other batches. In a verify run the first fit's arrays are therefore shuffled
once, here, with a permutation drawn from the run's seed (the same in every run), after
`validation_split` took its last rows as Keras takes them, and `fit` runs with
`shuffle=False`: every epoch sees that one order. A `PyDataset` keeps its batches'
order. A `tf.data` dataset or a generator orders its rows itself (seeded alike).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

NOTE = ("fit(shuffle={shuffle!r}): every run trains on one fixed shuffle of the rows (the "
        "same in each run, every epoch), as one device and N devices shuffle otherwise")


def _rows(tree: Any) -> int | None:
    import keras

    leaves = [leaf for leaf in keras.tree.flatten(tree) if leaf is not None]
    counts = {int(np.shape(leaf)[0]) for leaf in leaves if np.ndim(leaf)}
    return counts.pop() if len(counts) == 1 and leaves and all(np.ndim(v) for v in leaves) \
        else None


def _take(tree: Any, rows: Any) -> Any:
    import keras

    if tree is None:
        return None
    return keras.tree.map_structure(
        lambda a: None if a is None else np.asarray(keras.ops.convert_to_numpy(a))[rows], tree)


def fix(arguments: dict[str, Any], seed: int, is_stream: bool) -> str | None:
    """Makes `fit`'s shuffle one fixed order (see the module docstring), in place; returns
    the report's note, or `None` when nothing changed."""
    shuffle = arguments.get("shuffle", True)
    if not shuffle:
        return None
    note = NOTE.format(shuffle=shuffle)
    if is_stream:
        if type(arguments["x"]).__name__ != "generator":
            arguments["shuffle"] = False
            return note.replace("one fixed shuffle of the rows", "the batches in their order")
        return None
    total = _rows(arguments["x"])
    if total is None:
        return None
    split = arguments.get("validation_split") or 0.0
    at = int(math.floor(total * (1.0 - split))) if split else total
    if split and arguments.get("validation_data") is None:
        held = tuple(t for t in (_take(arguments.get(n), slice(at, None))
                                 for n in ("x", "y", "sample_weight")) if t is not None)
        arguments["validation_data"] = held
    arguments["validation_split"] = 0.0
    order = np.random.default_rng(seed).permutation(at)
    for name in ("x", "y", "sample_weight"):
        arguments[name] = _take(arguments.get(name), order)
    arguments["shuffle"] = False
    return note
