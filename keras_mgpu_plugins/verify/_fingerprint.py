"""A fingerprint of what the first `fit` trains on, so two runs prove they saw the same data.

Arrays (NumPy, a backend's tensors, dicts/lists/tuples of them) are hashed whole (a strided
sample of rows above `WHOLE_BYTES`). A `PyDataset` is hashed by its first batches (random
access), a `tf.data` dataset, a grain dataset or a `DataLoader` by the first batches of a
pass of its own. A generator cannot be read twice: it is replaced by one that hashes the
batches it passes on (`Tee`), and its fingerprint is complete once training has drawn them.
No backend: a tensor is converted with `keras.ops.convert_to_numpy`.
"""

from __future__ import annotations

import hashlib
import itertools
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

from keras_mgpu_plugins.inputs import streams

#: Above this many bytes, an array is hashed by a strided sample of its rows.
WHOLE_BYTES = 64 << 20
#: Batches of a dataset or generator that are hashed.
BATCHES = 8


def of_arrays(value: Any) -> str:
    """The hex digest of a tree of arrays (`None` leaves included)."""
    digest = hashlib.sha256()
    _update(digest, value)
    return digest.hexdigest()[:16]


def _update(digest: Any, value: Any) -> None:
    if value is None:
        digest.update(b"None")
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(repr(key).encode())
            _update(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _update(digest, item)
    elif isinstance(value, (str, bytes, int, float, bool)):
        digest.update(repr(value).encode())
    else:
        array = _numpy(value)
        digest.update(f"{array.dtype}{array.shape}".encode())
        if array.dtype == object:
            digest.update(repr(array.tolist()).encode())
            return
        if array.nbytes > WHOLE_BYTES and array.ndim:
            stride = int(np.ceil(array.nbytes / WHOLE_BYTES))
            array = array[::stride]
        digest.update(np.ascontiguousarray(array).tobytes())


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        import keras

        return np.asarray(keras.ops.convert_to_numpy(value))
    except Exception:  # noqa: BLE001 - a leaf Keras cannot convert: its text
        return np.asarray(repr(value), dtype=object)


class Tee:
    """A generator's batches, passed on unchanged, the first `BATCHES` hashed on the way."""

    def __init__(self, source: Iterator) -> None:
        self.source, self.digest, self.seen = source, hashlib.sha256(), 0

    def generator(self) -> Iterator:
        for item in self.source:
            if self.seen < BATCHES:
                _update(self.digest, item)
                self.seen += 1
            yield item

    def value(self) -> str:
        return f"generator:{self.digest.hexdigest()[:16]}:{self.seen}"


def of_input(value: Any) -> tuple[str, Any]:
    """The fingerprint of a `fit` input, and the input to train on instead (a generator is
    replaced by a `Tee`'s; the fingerprint is then the `Tee` itself, read later)."""
    found = streams.kind(value)
    if found is None:
        return of_arrays(value), value
    if found == "generator" or isinstance(value, types.GeneratorType):
        tee = Tee(value)
        return tee, tee.generator()  # type: ignore[return-value]
    digest = hashlib.sha256()
    if found == "PyDataset":
        count = _length(value)
        for index in range(min(BATCHES, count if count is not None else BATCHES)):
            _update(digest, value[index])
    else:  # tf.data, grain, DataLoader: a pass of their own
        for item in itertools.islice(iter(value), BATCHES):
            _update(digest, item)
    return f"{found}:{digest.hexdigest()[:16]}", value


def _length(value: Any) -> int | None:
    try:
        return int(value.num_batches if hasattr(value, "num_batches") else len(value))
    except (TypeError, ValueError):
        return None


def final(fingerprint: Any) -> str:
    """A fingerprint as text (a `Tee`'s once training drew its batches)."""
    return fingerprint.value() if isinstance(fingerprint, Tee) else str(fingerprint)
