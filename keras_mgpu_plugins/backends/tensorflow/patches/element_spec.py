"""Keras patch: the distributed symbolic build reads the input's element spec instead of a batch.

One record of the `PATCHES` table (`compat._registry`), `symbolic_build_from_element_spec`:
under a strategy, Keras's TensorFlow trainer builds the model before `fit`'s first
epoch (and `evaluate`'s first batch) from one batch it draws from the input, which
makes an iterator of the user's dataset that one device never makes. A `tf.data`
pipeline that reshuffles (`shuffle(..., reshuffle_each_iteration=True)`, the
default) draws a new order for each iterator made, so every epoch then trains on
the order one device trains on one epoch later.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches.trainer import (
    _all_built,
    _peeked_generator_batch,
)
from keras_mgpu_plugins.backends.tensorflow.rank import strategy_name
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require

# --- no upstream issue found: the distributed symbolic build draws a batch ------------------


def patch_build_from_element_spec() -> Any:
    """Under a strategy, `fit` and `evaluate` train on another order than one device.

    Keras's `_maybe_symbolic_build` (and `symbolic_build_per_replica_batch`, which it
    wraps) draws one batch from the epoch iterator to build the model, its
    compiled loss and metrics before the first step. Only each leaf's shape and
    dtype are used (`Trainer._symbolic_build` maps them to `KerasTensor`s), and
    the distributed dataset states them without an iterator: its `element_spec`,
    whose per-replica specs are those of the batches each replica gets (a
    static batch dimension, `drop_remainder=True` on one worker, is kept; under
    MultiWorkerMirroredStrategy TensorFlow states it as unknown, since a worker
    may get a batch of no rows). The first replica's spec is built from, as the
    first replica's batch was.

    Nothing is made of the input: no iterator of a reshuffling `tf.data` dataset
    (measured on tests/multi_device/test_reshuffled_input.py's data: the first step's
    loss 4.59 on 2 devices for 3.59 on one; 3.59 patched), no pass of a `PyDataset` fit
    with `shuffle=True` (whose shuffle the drawn batch drew: 0.10 off one device's
    weights after a step).
    The first batches Keras peeked from a Python generator are still built from
    (`symbolic_build_per_replica_batch`), and a model with everything built
    builds nothing.

    Raises:
        ValueError: For an input element whose spec states no shape and dtype
            (not a dense, ragged or sparse tensor, nor None): drawing a batch to
            read them could change the order of a reshuffling input.
    """
    require("distributed_element_spec")
    trainer = resolve("tensorflow trainer")
    inner = trainer._maybe_symbolic_build

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if (iterator is None or self._distribute_strategy is None
                or _peeked_generator_batch(iterator) is not None):
            return inner(self, iterator=iterator, data_batch=data_batch)
        if _all_built(self):
            return None
        batch = element_spec_batch(iterator, self.distribute_strategy)
        return inner(self, iterator=None, data_batch=batch)

    trainer._maybe_symbolic_build = _maybe_symbolic_build
    return lambda: setattr(trainer, "_maybe_symbolic_build", inner)


def element_spec_batch(iterator: Any, strategy: Any) -> Any:
    """The first replica's spec of each leaf of the batches `iterator` (a `TFEpochIterator`)
    would give, made without an iterator of its input.

    A leaf spec with a batch dimension of 0 (a worker's share of a global batch smaller than
    the workers) is given any number of rows, as `patches.trainer._any_rows` does for a batch.

    Raises:
        RuntimeError: `iterator` holds no distributed dataset (not Keras's epoch iterator).
        ValueError: A leaf spec without a shape and a dtype.
    """
    import tensorflow as tf

    dataset = getattr(iterator, "_distributed_dataset", None)
    if dataset is None:
        raise RuntimeError(
            f"kmp.compat patch symbolic_build_from_element_spec: under {strategy_name(strategy)} "
            f"the model is built from the input's element_spec, and {type(iterator).__name__} "
            "holds no distributed dataset to read it from (Keras's TFEpochIterator does). "
            "Build the model, its compiled metrics and optimizer before fit, or report it.")
    per_replica = resolve("per replica spec")

    def leaf(spec: Any) -> Any:
        if isinstance(spec, per_replica):
            spec = spec._value_specs[0]
        if type(spec).__name__ == "NoneTensorSpec":
            return None
        shape, dtype = getattr(spec, "shape", None), getattr(spec, "dtype", None)
        if not isinstance(shape, tf.TensorShape) or not isinstance(dtype, tf.DType):
            raise ValueError(
                f"Under {strategy_name(strategy)} keras_mgpu_plugins builds the model before "
                "the first step from the shapes and dtypes of the input's elements (Keras "
                "draws a batch instead, which makes an iterator one device never makes: a "
                "reshuffling tf.data input would then train on another order). Received: an "
                f"element of spec {spec!r}, which states none. Map the input to tensors "
                "(dense, ragged or sparse) before fit/evaluate.")
        if shape.rank and shape[0] == 0:
            return tf.TensorSpec((None, *shape[1:]), dtype)
        return spec

    return tf.nest.map_structure(leaf, dataset.element_spec)


def symbolic_build_draws_a_batch() -> bool | None:
    """Whether the TensorFlow trainer's own `_maybe_symbolic_build` draws a batch (read from
    its module: the class's method may be patched)."""
    return source_has(resolve("tensorflow trainer module"), "def _maybe_symbolic_build(",
                      "maybe_distributed_data_batch = next(it)")


def check_element_spec() -> list[str]:
    """What `element_spec_batch` needs: the epoch iterator's distributed dataset, and the
    per-replica spec's specs of each replica."""
    import inspect

    from keras_mgpu_plugins.compat._names import missing

    problems = missing("tensorflow epoch iterator", "per replica spec")
    if problems:
        return problems
    iterator = resolve("tensorflow epoch iterator")
    if "self._distributed_dataset = " not in inspect.getsource(iterator.__init__):
        problems.append("tensorflow epoch iterator.__init__ no longer sets _distributed_dataset")
    if "_value_specs" not in getattr(resolve("per replica spec"), "__slots__", ()):
        problems.append("per replica spec no longer holds _value_specs")
    return problems
