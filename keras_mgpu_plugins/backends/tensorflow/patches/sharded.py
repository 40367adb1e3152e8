"""Keras variables split over parameter servers (`ShardedVariable`): the `kmp.compat` records.

Under `ParameterServerStrategy` with a `variable_partitioner`, TensorFlow makes a large
variable a `ShardedVariable`: consecutive rows on each parameter server. Keras 3 keeps it
inside its `Variable` but none of its training code expects one:

- `partitioned_initialization`: Keras creates the variable from `lambda:
  initializer(shape)` without a shape, so TensorFlow computes the whole value on the chief
  and slices it; kmp creates it as zeros with its shape (each parameter server makes its
  own shard), then draws each shard's rows on its parameter server, a few MiB at a time
  (a random initializer then gives other values than one device, from the same
  distribution; one whose scale depends on the shape, Glorot or He, is computed whole as
  Keras does; an unsplit variable gets one device's values);
- `sharded_embedding_lookup`: `Embedding` reads its table with `ops.take`, which first
  joins every shard into one tensor on the worker; kmp looks the rows up in each shard
  (`tf.nn.embedding_lookup`), so only the rows of the batch travel;
- `sharded_gradient_sources`: `GradientTape.gradient` asks a Keras variable for its one
  resource handle (`AttributeError: 'ShardedVariable' object has no attribute 'handle'`);
  kmp differentiates with respect to the shards and gives Keras one gradient of the whole
  variable (an `IndexedSlices` of the rows touched);
- `sharded_optimizer_updates`: the optimizer applies each update in
  `extended.update`, which colocates with the variable (`NotImplementedError:
  ShardedVariable doesn't support being used as a reference`); kmp applies a sharded
  variable's update directly: `scatter_sub` on each shard, on its parameter server;
- `sharded_optimizer_slots`: an optimizer slot (Adam's moments) is colocated with its
  variable, which for a sharded one leaves it whole on one parameter server; kmp creates
  it under the partitioner, sharded alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import missing, resolve


def is_sharded(value: Any) -> bool:
    """Whether `value` is TensorFlow's `ShardedVariable` (private use `tf_sharded_variable`)."""
    return isinstance(value, resolve("sharded variable"))


def check_sharded_variable() -> list[str]:
    """What `tf_sharded_variable` needs of TensorFlow's `ShardedVariable`."""
    problems = missing("sharded variable")
    if problems:
        return problems
    return [] if isinstance(getattr(resolve("sharded variable"), "variables", None), property) else [
        "ShardedVariable.variables is gone"]


def _keras_sharded(variable: Any) -> Any:
    """The `ShardedVariable` inside a Keras variable, else `None`."""
    from keras import Variable

    if isinstance(variable, Variable):
        value = variable.value
        return value if is_sharded(value) else None
    return None


def _replace(owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
    """Sets `owner.name = make(original)`; returns the undo."""
    original = owner.__dict__.get(name)
    setattr(owner, name, make(getattr(owner, name)))

    def undo() -> None:
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)

    return undo


#: Keras initializers whose values do not depend on the variable's shape: a shard can be drawn
#: alone. Others (Glorot, He, orthogonal: scaled by the fans) are computed whole, as by Keras.
SHAPE_FREE_INITIALIZERS = ("RandomUniform", "RandomNormal", "TruncatedNormal", "Zeros", "Ones",
                           "Constant")
#: Rows are drawn on the parameter server in pieces of at most this many bytes.
INIT_CHUNK_BYTES = 4 << 20


def patch_partitioned_initialization() -> Any:
    """A Keras variable made under a parameter-server strategy is created as zeros on the
    parameter servers, then each shard drawn there in pieces: no task holds the whole value,
    and a parameter server holds its shard and one piece."""
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow.parameter_server.cluster import (
        is_parameter_server,
    )

    def make(keras_init: Any) -> Any:
        def _initialize_with_initializer(self: Any, initializer: Any) -> Any:
            if (not is_parameter_server(tf.distribute.get_strategy()) or self._shape is None
                    or not self._shape
                    or type(initializer).__name__ not in SHAPE_FREE_INITIALIZERS):
                return keras_init(self, initializer)
            shape, dtype = tuple(self._shape), self._dtype

            def zeros(partition_shape: Any = None, partition_offset: Any = None) -> Any:
                return tf.zeros(tuple(partition_shape or shape), dtype=dtype)

            self._value = tf.Variable(
                zeros, shape=shape, dtype=dtype, trainable=self.trainable, name=self.name,
                aggregation=self._map_aggregation(self.aggregation),
                synchronization=self._map_synchronization(self.synchronization))
            if not is_sharded(self._value):  # whole: drawn as Keras draws it, one device's values
                self._value.assign(initializer(shape, dtype=dtype))
            elif type(initializer).__name__ != "Zeros":
                _fill(self._value.variables, initializer, dtype)
            return None

        return _initialize_with_initializer

    return _replace(resolve("tensorflow variable"), "_initialize_with_initializer", make)


def _fill(shards: list, initializer: Any, dtype: Any) -> None:
    """Draws each shard's rows on its own device, `INIT_CHUNK_BYTES` at a time."""
    import tensorflow as tf

    for shard in shards:
        rows, rest = int(shard.shape[0]), tuple(shard.shape[1:])
        row_bytes = max(1, shard.shape[1:].num_elements() * shard.dtype.size)
        step = max(1, INIT_CHUNK_BYTES // row_bytes)
        with tf.device(shard.device):
            for first in range(0, rows, step):
                last = min(rows, first + step)
                rows_drawn = initializer((last - first, *rest), dtype=dtype)
                shard.scatter_update(tf.IndexedSlices(rows_drawn, tf.range(first, last)))


def patch_embedding_lookup() -> Any:
    """`Embedding.call` looks a sharded table's rows up shard by shard."""
    import keras
    import tensorflow as tf

    def make(keras_call: Any) -> Any:
        def call(self: Any, inputs: Any) -> Any:
            table = _keras_sharded(getattr(self, "_embeddings", None))
            if table is None or self.lora_enabled or self.quantization_mode:
                return keras_call(self, inputs)
            rows = tf.nn.embedding_lookup(table, tf.cast(inputs, "int32"))
            return keras.ops.cast(rows, dtype=self.compute_dtype)

        return call

    return _replace(keras.layers.Embedding, "call", make)


def patch_gradient_sources() -> Any:
    """`GradientTape.gradient` with respect to a Keras variable made of shards."""
    import tensorflow as tf

    def make(tf_gradient: Any) -> Any:
        def gradient(self: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
            flat = tf.nest.flatten(sources)
            tables = [_keras_sharded(s) for s in flat]
            if not any(t is not None for t in tables):
                return tf_gradient(self, target, sources, *args, **kwargs)
            expanded = [part for s, t in zip(flat, tables, strict=True)
                        for part in (t.variables if t is not None else [s])]
            grads = iter(tf_gradient(self, target, expanded, *args, **kwargs))
            joined = [_join([next(grads) for _ in t.variables], t) if t is not None
                      else next(grads) for t in tables]
            return tf.nest.pack_sequence_as(sources, joined)

        return gradient

    return _replace(tf.GradientTape, "gradient", make)


def _join(parts: list, table: Any) -> Any:
    """One gradient of the whole `table` from its shards' (`None` where none was touched)."""
    import tensorflow as tf

    if all(p is None for p in parts):
        return None
    offset, values, indices = 0, [], []
    for part, shard in zip(parts, table.variables, strict=True):
        rows = int(shard.shape[0])
        if part is not None:
            if not isinstance(part, tf.IndexedSlices):
                part = tf.IndexedSlices(part, tf.range(rows, dtype=tf.int64))
            values.append(part.values)
            indices.append(tf.cast(part.indices, tf.int64) + offset)
        offset += rows
    return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0),
                            tf.constant(list(table.shape), tf.int64))


def patch_sharded_updates() -> Any:
    """The optimizer updates a sharded variable shard by shard (no `extended.update`)."""

    def make(keras_step: Any) -> Any:
        def _distributed_tf_update_step(self: Any, distribution: Any, grads_and_vars: Any,
                                        learning_rate: Any) -> Any:
            others = []
            for grad, var in grads_and_vars:
                if is_sharded(var):  # scatter_sub / assign on each shard, where it lives
                    self.update_step(grad, var, learning_rate)
                else:
                    others.append((grad, var))
            return keras_step(self, distribution, others, learning_rate)

        return _distributed_tf_update_step

    return _replace(resolve("tensorflow optimizer"), "_distributed_tf_update_step", make)


def patch_sharded_slots() -> Any:
    """An optimizer slot of a sharded variable is created sharded, not colocated."""

    def make(keras_add: Any) -> Any:
        def add_variable_from_reference(self: Any, reference_variable: Any, name: Any = None,
                                        initializer: Any = "zeros") -> Any:
            if _keras_sharded(reference_variable) is None:
                return keras_add(self, reference_variable, name=name, initializer=initializer)
            return resolve("base optimizer").add_variable_from_reference(
                self, reference_variable, name=name, initializer=initializer)

        return add_variable_from_reference

    return _replace(resolve("tensorflow optimizer"), "add_variable_from_reference", make)


# --- what each record relies on (`Patch.present`) -----------------------------------------


def initializes_whole() -> bool | None:

    return source_has(resolve("tensorflow variable")._initialize_with_initializer, "initializer(self._shape")


def embedding_takes_whole_table() -> bool | None:
    import keras

    return source_has(keras.layers.Embedding.call, "ops.take(self.embeddings")


def gradient_needs_one_handle() -> bool | None:

    return source_has(resolve("tensorflow variable").handle.fget, "self.value.handle")


def updates_colocate() -> bool | None:

    return source_has(resolve("tensorflow optimizer")._distributed_tf_update_step,
                      "distribution.extended.update(")


def slots_colocate() -> bool | None:

    return source_has(resolve("tensorflow optimizer").add_variable_from_reference, "colocate_vars_with")
