"""`fit`'s input under parameter servers: what each closure sent to a worker reads.

- NumPy arrays (and tensors): the arrays travel inside the step function, once per
  worker (graph constants), and each closure is given the rows of its batches. The
  chief deals the batches out in the order one device would read them (shuffled per
  epoch with `shuffle=True`), so each row is read once per epoch whichever worker runs
  it, a closure retried on another worker reads the same rows, and one worker trains
  exactly as one device.
- A `tf.data.Dataset`, or a function returning one (called with no argument, or with a
  `tf.distribute.InputContext`): TensorFlow's per-worker datasets
  (`ClusterCoordinator.create_per_worker_dataset`): each worker reads the whole
  dataset, repeated, in its own order where the dataset shuffles; each closure takes
  its next batches. The chief counts the steps of an epoch.

Anything else (a Python generator, a `keras.utils.PyDataset`, a dataset that calls
Python) cannot be made on the workers: `make` raises, naming what works.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np

#: Above this many bytes of NumPy input, the step function would pass TensorFlow's 2 GiB
#: limit of a function's graph: `make` asks for a dataset instead.
MAX_ARRAY_BYTES = 1 << 30

_WHAT_WORKS = ("NumPy arrays (or tensors), a tf.data.Dataset built from tensors or files "
               "(no Python generator, py_function or numpy_function in it), or a function "
               "returning such a dataset, called on each worker")


class ArrayInput:
    """NumPy input: each closure gets the rows of its batches (`args`)."""

    def __init__(self, data: tuple, batch_size: int, shuffle: bool, steps: int | None) -> None:
        self.data = data  # (x,), (x, y) or (x, y, sample_weight), of NumPy arrays
        self.rows = len(_first(data))
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.batches_per_pass = math.ceil(self.rows / batch_size)
        self.steps = steps or self.batches_per_pass
        self._order: list[np.ndarray] = []  # batches dealt out, in order, not yet read
        # Seeded from NumPy's global generator: keras.utils.set_random_seed fixes the order.
        self._rng = np.random.default_rng(np.random.randint(2**31))

    def element(self) -> Any:
        """The first batch's shapes and dtypes (to build the model before any step)."""
        import keras

        return keras.tree.map_structure(lambda a: a[: self.batch_size], self.data)

    def args(self, count: int) -> tuple:
        """The rows of the next `count` batches, and where each batch starts and ends."""
        batches = [self._next_batch() for _ in range(count)]
        bounds = np.cumsum([0] + [len(b) for b in batches]).astype(np.int64)
        return (np.concatenate(batches).astype(np.int64), bounds)

    def _next_batch(self) -> np.ndarray:
        if not self._order:
            rows = self._rng.permutation(self.rows) if self.shuffle else np.arange(self.rows)
            self._order = [rows[i:i + self.batch_size]
                           for i in range(0, self.rows, self.batch_size)]
        return self._order.pop(0)

    def batches(self, rows: Any, bounds: Any) -> Any:
        """In the step function: the graph's arrays and a function giving batch `i`."""
        import tensorflow as tf

        constants = tf.nest.map_structure(tf.constant, self.data)

        def batch(i: Any) -> Any:
            take = rows[bounds[i]:bounds[i + 1]]
            return tf.nest.map_structure(lambda c: tf.gather(c, take), constants)

        return batch


class DatasetInput:
    """A dataset (or dataset function) read on every worker through a per-worker iterator."""

    def __init__(self, coordinator: Any, make: Any, spec: Any, steps: int) -> None:
        self.steps = steps
        self.spec = spec
        self.iterator = iter(coordinator.create_per_worker_dataset(make))

    def element(self) -> Any:
        return self.spec

    def args(self, count: int) -> tuple:
        return (self.iterator, np.int64(count))


def make(coordinator: Any, x: Any, y: Any, sample_weight: Any, batch_size: int | None,
         shuffle: bool, class_weight: Any, steps_per_epoch: int | None) -> Any:
    """The input of one `fit` (`ArrayInput` or `DatasetInput`).

    Raises:
        ValueError: For an input that cannot be made on the workers, `y`/`sample_weight`/
            `batch_size`/`class_weight` beside a dataset, or `steps_per_epoch` missing
            where the dataset's length is unknown.
    """
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset) or (callable(x) and not _is_array(x)):
        _refuse_beside_dataset(y=y, sample_weight=sample_weight, batch_size=batch_size,
                               class_weight=class_weight)
        return _dataset_input(coordinator, x, steps_per_epoch)
    if x is None or not all(_is_array(a) for a in _leaves(x)):
        raise ValueError(
            "Under parameter servers, fit's x must be one of: " + _WHAT_WORKS + ". Received: "
            f"x of type {type(x).__name__}. A Python generator or keras.utils.PyDataset runs in "
            "the chief's Python, which the workers cannot call: wrap its source in a "
            "tf.data.Dataset (from files or arrays), or pass the arrays.")
    data = tuple(_numpy(a) for a in (x, y, sample_weight) if a is not None)
    if class_weight is not None:
        data = _with_class_weight(data, class_weight)
    size = sum(a.nbytes for a in _leaves(data))
    if size > MAX_ARRAY_BYTES:
        raise ValueError(
            f"Under parameter servers, NumPy inputs travel to each worker inside the step "
            f"function, whose graph TensorFlow limits to 2 GiB; these are {size / 2**30:.1f} "
            "GiB. Received: x (and y, sample_weight) of that size. Pass a tf.data.Dataset "
            "reading files (e.g. TFRecord), or a function returning one, with steps_per_epoch.")
    rows = {len(a) for a in _leaves(data)}
    if len(rows) != 1:
        raise ValueError(f"x, y and sample_weight must have the same number of rows. Received: "
                         f"{sorted(rows)} rows")
    return ArrayInput(data, batch_size or 32, shuffle, steps_per_epoch)


def _dataset_input(coordinator: Any, x: Any, steps: int | None) -> DatasetInput:
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        known = int(x.cardinality())
        spec, make = x.element_spec, x.repeat() if known >= 0 else x
        name = "x (a tf.data.Dataset)"
        graph = _graph_of(lambda: x._as_serialized_graph())
    else:
        fn, known = x, -2
        takes_context = len(inspect.signature(fn).parameters) > 0

        def make() -> Any:
            dataset = fn(tf.distribute.InputContext()) if takes_context else fn()
            if not isinstance(dataset, tf.data.Dataset):
                raise ValueError("The dataset function passed as x must return a "
                                 f"tf.data.Dataset. Received: {type(dataset).__name__}")
            return dataset.repeat()

        name = f"x (the dataset function {getattr(fn, '__qualname__', fn)!r})"
        traced = tf.function(make).get_concrete_function()
        spec = traced.structured_outputs.element_spec
        graph = traced.graph.as_graph_def()
        if any(t.dtype == tf.variant for t in traced.captured_inputs):
            raise ValueError(
                f"{name} cannot be made on each worker: it returns a dataset made outside it, "
                "which lives in the chief's process. Build the dataset inside the function "
                "(tf.data.Dataset.from_tensor_slices(...), TFRecordDataset(...) in its body), "
                "or pass the dataset itself as x.")
    python = _python_ops(graph)
    if python:
        raise ValueError(
            f"{name} cannot be made on each worker: it calls Python ({', '.join(python)}: a "
            "Dataset.from_generator, tf.py_function or tf.numpy_function), which runs in the "
            "chief's process only. Under parameter servers, x must be one of: " + _WHAT_WORKS
            + ". Received: " + name)
    if steps is None and known < 0:
        why = "infinite" if known == -1 else "unknown"
        raise ValueError(
            f"steps_per_epoch is required under parameter servers when the input's length is "
            f"{why}: {name}. Received: steps_per_epoch=None. Pass steps_per_epoch=N (the "
            "number of batches, summed over every worker, that make an epoch), or a finite "
            "tf.data.Dataset, or NumPy arrays (their length gives it).")
    try:
        return DatasetInput(coordinator, make, spec, steps or known)
    except (TypeError, ValueError, tf.errors.OpError) as err:
        raise ValueError(
            f"{name} cannot be made on each worker ({type(err).__name__}: {err}). Under "
            "parameter servers, x must be one of: " + _WHAT_WORKS + ".") from err


_PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")


def _graph_of(serialize: Any) -> Any:
    """The `GraphDef` a dataset serializes to, or `None` if it cannot be serialized."""
    import tensorflow as tf

    try:
        return tf.compat.v1.GraphDef.FromString(serialize().numpy())
    except Exception:  # noqa: BLE001 - creating the per-worker dataset names the cause
        return None


def _python_ops(graph: Any) -> list[str]:
    """The ops of `graph` (its function library too) that call back into Python."""
    if graph is None:
        return []
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return sorted({n.op for n in nodes if n.op in _PYTHON_OPS})


def _refuse_beside_dataset(**given: Any) -> None:
    for name, value in given.items():
        if value is not None:
            raise ValueError(
                f"{name} applies to NumPy inputs; a dataset (or dataset function) yields its "
                f"own batches (x, y, sample_weight). Received: {name}={value!r:.80}")


def _with_class_weight(data: tuple, class_weight: dict) -> tuple:
    if len(data) < 2:
        raise ValueError(f"class_weight needs targets y. Received: class_weight={class_weight!r}")
    y = data[1]
    labels = y.argmax(axis=-1) if y.ndim > 1 and y.shape[-1] > 1 else y.reshape(len(y), -1)[:, 0]
    try:
        weights = np.array([class_weight[int(label)] for label in labels], dtype="float32")
    except KeyError as err:
        raise ValueError(f"class_weight has no weight for class {err.args[0]}. Received: "
                         f"class_weight={class_weight!r}") from None
    if len(data) == 3:
        weights = weights * data[2].astype("float32")
    return (data[0], data[1], weights)


def _numpy(value: Any) -> Any:
    import keras

    return keras.tree.map_structure(np.asarray, value)


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not callable(value)


def _leaves(value: Any) -> list:
    import keras

    return keras.tree.flatten(value)


def _first(data: tuple) -> Any:
    return _leaves(data[0])[0]
