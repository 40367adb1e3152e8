"""A `keras.utils.PyDataset`, a generator, a `tf.data.Dataset`, a grain dataset or a
`torch.utils.data.DataLoader` on several processes, as on one device.

Every process passes the same input (the same class and arguments, the same seeds),
which yields the same global batches in the same order; each process keeps its part
of each (the backend's `Sharing`), so that together they train on the very batch one
device trains on. A `PyDataset` is served as a `PyDataset` of this process's shares (read in
the main thread, the user's `workers` as prefetching threads; `fit(shuffle=True)`
permutes the order of its batches the same way on every process, once per pass),
a generator as a generator of them, a `tf.data.Dataset` (where the user has
TensorFlow), a grain dataset or a `DataLoader` (where the user has torch; one without a
`DistributedSampler`: kmp takes each process's share itself) as a `PyDataset` reading
its passes in order.

Never silently different data: every batch's fingerprint (the input's batch count,
the batch's structure, shapes, dtypes and a checksum of a few rows) is compared across
the processes, one all-gather for each of the first `CHECK_FIRST` batches, then one per
`CHECK_EVERY` batches (and at a pass's last batch, at a generator's end); a difference
raises `InputsDifferError` on every process, naming the input and the first batch that
differs. Each all-gather also waits for the steps before it (measured about 4 ms on 2
busy CPU cores), hence the grouping.
"""

from __future__ import annotations

import concurrent.futures
import functools
import sys
import types
import zlib
from typing import Any

import numpy as np

CHECK_FIRST = 8  # every batch of the first ones (where a different seed or order shows)
CHECK_EVERY = 16  # then every CHECK_EVERY-th batch (each check is one all-gather)
_END = -1  # the rows of a generator's "end" fingerprint
_PAD = -3  # a fingerprint slot no batch filled


class InputsDifferError(ValueError):
    """The processes' inputs yield different batches (kmp would train on other data)."""


def kind(value: Any) -> str | None:
    """`"PyDataset"`, `"generator"`, `"tf.data.Dataset"`, `"grain"` (a grain `MapDataset`
    or `IterDataset`: what keras-hub's tasks make of numpy arrays) or `"DataLoader"` (torch's)
    when `value` is one, else `None`."""
    import keras

    if isinstance(value, keras.utils.PyDataset):
        return "PyDataset"
    if isinstance(value, types.GeneratorType):
        return "generator"
    tf = sys.modules.get("tensorflow")  # never imported here: only a user's tf.data is one
    if tf is not None and isinstance(value, getattr(getattr(tf, "data", None), "Dataset", ())):
        return "tf.data.Dataset"
    grain = sys.modules.get("grain")  # likewise: only a user's (or keras-hub's) grain dataset
    if grain is not None and isinstance(value, (getattr(grain, "MapDataset", ()),
                                                getattr(grain, "IterDataset", ()))):
        return "grain"
    torch_data = sys.modules.get("torch.utils.data")  # likewise: only a user's DataLoader
    if torch_data is not None and isinstance(value, getattr(torch_data, "DataLoader", ())):
        return "DataLoader"
    return None


def shared(value: Any, what: str, sharing: Any, shuffle: Any = False) -> Any:
    """This process's shares of every batch of `value` (a `PyDataset`, a generator, or a
    `tf.data.Dataset`, grain dataset or `DataLoader`: its passes read in order, as Keras
    reads one, `shuffle` its own).

    Args:
        value: The input, the same on every process.
        what: How the user passed it, for errors (`"fit(x=...)"`).
        sharing: The backend's `inputs.sharing.Sharing` (which rows each process feeds).
        shuffle: fit's `shuffle` (a `PyDataset`'s batch order; a generator's is its own).
    """
    found = kind(value)
    split = functools.partial(share, sharing=sharing)
    if found == "PyDataset":
        return _share_py_dataset(value, what, split, shuffle, sharing)
    if found in ("tf.data.Dataset", "grain", "DataLoader"):
        from keras_mgpu_plugins.inputs.datasets import passes

        return _share_py_dataset(passes(value, found, what), what, split, False, sharing)
    return _share_generator(value, what, split, sharing)


def share(batch: Any, what: str, index: int, sharing: Any) -> Any:
    """This process's piece of the global `batch` (`Sharing.piece`)."""
    count = rows_of(batch)
    if count < 0:
        raise ValueError(f"{what}: batch {index} holds arrays of different row counts.")
    sharing.check_rows(count, f"{what}: batch {index}")
    return sharing.piece(batch, count)


def rows_of(batch: Any) -> int:
    """The rows of `batch`'s arrays (-2 when they differ, 0 when it holds none)."""
    import keras

    sizes = {int(a.shape[0]) for a in keras.tree.flatten(batch) if _is_array(a)}
    return sizes.pop() if len(sizes) == 1 else 0 if not sizes else -2


class Checker:
    """Compares the processes' batches of one input: every batch's `fingerprint`, gathered
    (one all-gather) for each of the first `CHECK_FIRST` batches, then every `CHECK_EVERY`
    batches and at each pass's last batch; a difference raises `InputsDifferError` on every
    process, naming the first batch that differs."""

    def __init__(self, what: str, runtime: Any, batches: int | None = None) -> None:
        self.what, self.runtime, self.batches, self.seen = what, runtime, batches or 0, 0
        self.pending: list[np.ndarray] = []

    def see(self, batch: Any, index: int) -> None:
        """Takes batch `index` (`None`: the input ended before it); compares when it is time."""
        self.pending.append(fingerprint(batch, index, self.batches))
        self.seen += 1
        if (self.seen <= CHECK_FIRST or len(self.pending) == CHECK_EVERY or batch is None
                or index == self.batches - 1):
            mine, self.pending = self.pending, []
            compare(np.stack(mine), self.what, self.runtime)


def compare(mine: np.ndarray, what: str, runtime: Any) -> None:
    """Raises `InputsDifferError` on every process where the processes' fingerprints differ."""
    wire = np.full((CHECK_EVERY, 5), _PAD, np.int64)  # one shape on every process
    wire[:len(mine)] = mine
    every = runtime.all_gather(wire)
    differ = ~(every == every[0]).all(axis=(0, 2))
    if not differ.any():
        return
    row = int(np.argmax(differ))
    index = next(int(v) for v in every[:, row, 0] if v != _PAD)
    seen = "; ".join(f"process {p}: {_describe(r)}" for p, r in enumerate(every[:, row]))
    raise InputsDifferError(
        f"{what}: batch {index} differs between the processes ({seen}). kmp feeds each "
        "process its share of every global batch, so every process must pass the same input "
        "yielding the same batches in the same order: the same data, the same seeds for any "
        "shuffle or augmentation (e.g. keras.utils.set_random_seed(seed) on every process).")


def fingerprint(batch: Any, index: int, batches: int = 0) -> np.ndarray:
    """`[index, rows, batches, structure, content]`: the structure and the shapes and dtypes
    (crc32), a few rows' bytes (crc32: the first, middle and last row of every array)."""
    import keras

    if batch is None:
        return np.array([index, _END, batches, 0, 0], np.int64)
    leaves = keras.tree.flatten(batch)
    layout = repr((keras.tree.map_structure(lambda _: 0, batch),
                   [(tuple(np.shape(a)), str(getattr(a, "dtype", type(a)))) for a in leaves]))
    content = 0
    for leaf in leaves:
        array = np.asarray(leaf)
        picked = array[[0, len(array) // 2, -1]] if array.ndim and len(array) else array
        content = zlib.crc32(np.ascontiguousarray(picked).tobytes(), content)
    return np.array([index, rows_of(batch), batches, zlib.crc32(layout.encode()),
                     content],
                    np.int64)


def _describe(row: np.ndarray) -> str:
    index, rows, batches, layout, content = (int(v) for v in row)
    if index == _PAD:
        return "no batch here (its input ended before)"
    if rows == _END:
        return f"no batch {index} (its input ended)"
    total = f", {batches} batches" if batches else ""
    return f"{rows} rows{total}, layout {layout:08x}, rows checksum {content:08x}"


def _is_array(value: Any) -> bool:
    return bool(getattr(value, "shape", ()))


def _share_generator(generator: Any, what: str, split: Any, sharing: Any) -> Any:
    def shares() -> Any:
        checker, index = Checker(what, sharing.runtime), 0
        sharing.start_pass()
        for batch in generator:
            checker.see(batch, index)
            yield split(batch, what, index)
            index += 1
        checker.see(None, index)  # a process whose input ended early: named (at a check)

    return shares()


def _share_py_dataset(dataset: Any, what: str, split: Any, shuffle: Any, sharing: Any) -> Any:
    import keras

    from keras_mgpu_plugins.inputs import shuffle as shuffling

    if dataset.use_multiprocessing:
        raise ValueError(
            f"{what}: a PyDataset with use_multiprocessing=True on several processes: kmp "
            "reads its batches in this process, to check that every process sees the same "
            "ones. Pass use_multiprocessing=False (its workers then prefetch in threads).")
    batches = dataset.num_batches
    # Keras shuffles the batch order of a PyDataset of known length only
    shuffles = bool(shuffle) and batches is not None
    if shuffles:
        shuffling.require()

    class Shares(keras.utils.PyDataset):
        """This process's share of every batch of the user's `PyDataset`."""

        def __init__(self) -> None:
            super().__init__()  # workers=1: Keras reads it in the main thread, in order
            self.passes = 0
            self.order = None
            self.ahead: dict[int, concurrent.futures.Future] = {}
            self.checker = Checker(what, sharing.runtime, batches)
            self.pool = (concurrent.futures.ThreadPoolExecutor(dataset.workers)
                         if dataset.workers > 1 else None)

        @property
        def num_batches(self) -> int | None:
            return batches

        def __len__(self) -> int:
            return batches

        def _position(self, i: int) -> int:
            return int(self.order[i]) if self.order is not None else i

        def _fetch(self, i: int) -> Any:
            if self.pool is None:
                return dataset[self._position(i)]
            last = batches if batches is not None else i + dataset.workers + 1
            for j in range(i, min(last, i + dataset.workers + 1)):
                if j not in self.ahead:
                    self.ahead[j] = self.pool.submit(dataset.__getitem__, self._position(j))
            return self.ahead.pop(i).result()

        def __getitem__(self, i: int) -> Any:
            if i == 0:
                self.passes += 1
                self.ahead.clear()
                sharing.start_pass()
                if shuffles:  # as Keras's adapter, from Python's random state; agreed
                    self.order = shuffling.agreed(shuffling.batch_order(batches),
                                                  sharing.runtime)
            batch = self._fetch(i)
            self.checker.see(batch, i)
            return split(batch, what, i)

        def on_epoch_begin(self) -> None:
            getattr(dataset, "on_epoch_begin", lambda: None)()

        def on_epoch_end(self) -> None:
            getattr(dataset, "on_epoch_end", lambda: None)()

    return Shares()
