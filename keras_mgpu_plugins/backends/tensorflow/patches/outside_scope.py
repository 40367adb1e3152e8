"""A `compile` given an optimizer or metrics made outside the model's strategy takes them in.

Keras makes an optimizer's `iterations` (and its learning-rate variable), and a
metric's state, when the object is constructed, and a TensorFlow optimizer
remembers the strategy current at that moment. The usual fine-tuning recipe
constructs them in the `compile(...)` call itself (`keras.optimizers.Adam(1e-5)`,
`metrics=[keras.metrics.BinaryAccuracy()]`), so for a model made under a
strategy and compiled again outside its scope they belong to no strategy:

- 2 replicas in one process: each replica adds one to the plain `iterations`
  (16 after 8 steps), so a learning-rate schedule decays twice as fast and the
  weights end elsewhere, with no warning. Adam (any optimizer with slots) fails
  in `fit`: "Mixing different tf.distribute.Strategy objects".
- 2 workers: a metric made outside counts only its own worker's rows (each
  worker logs another value); Adam fails as above.

tf.keras created an optimizer's variables at its first use, under the model's
strategy (keras-team/keras#17187: the Keras 2.11 optimizers, and Keras 3, need
it made in the scope). `patch_adopt_outside_state` takes such objects in: the
variables of an optimizer not yet used (and of any metric) are made again in the
model's strategy, with the same values, names and aggregation, on the same
objects, so `opt.iterations` is the model's. An optimizer that already trained
outside the strategy cannot be taken in equivalently: `compile` raises. A model
class whose `compile` keeps optimizers itself gets the same from `wrap_compile`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve


def patch_adopt_outside_state() -> Any:
    """Replaces `Trainer.compile`: optimizers and metrics given to it join the model's strategy.

    Applies when the model was made under a strategy spanning replicas or workers
    and `compile` runs outside any strategy scope or in the model's own (the
    factory). One device keeps Keras's code.
    """
    import tensorflow as tf

    base_trainer = resolve("base trainer")
    original = base_trainer.compile

    @functools.wraps(original)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = getattr(self, "_distribute_strategy", None)
        here = tf.distribute.get_strategy() if tf.distribute.has_strategy() else strategy
        if strategy is not None and here is strategy and distributing(strategy):
            for given in _keras_objects((args, kwargs)):
                adopt(given, strategy, self)
        return original(self, *args, **kwargs)

    base_trainer.compile = compile
    return lambda: setattr(base_trainer, "compile", original)


def wrap_compile(model: Any, strategy: Any) -> None:
    """A model class's own `compile` takes in every optimizer and metric among its arguments.

    The registered per-instance patch `overridden_compile_adopts_its_arguments`, applied by
    `kmp.parallelize` to a model whose class overrides `compile` and keeps optimizers
    itself (keras.io's GAN: `compile(d_optimizer, g_optimizer, loss_fn)` calls
    `super().compile()`, then stores them): `Trainer.compile` never sees those. Outside
    any strategy scope, the whole `compile` runs in the model's, as Keras's own does
    (`compile_in_model_strategy_scope`).
    """
    import tensorflow as tf

    original = model.compile

    def compile(*args: Any, **kwargs: Any) -> Any:
        for given in _keras_objects((args, kwargs)):
            adopt(given, strategy, model)
        with contextlib.nullcontext() if tf.distribute.has_strategy() else strategy.scope():
            return original(*args, **kwargs)

    model.compile = compile


def optimizer_takes_strategy_at_construction() -> bool | None:
    """Whether Keras still makes `iterations` and captures the strategy in the constructor."""
    made = source_has(resolve("base optimizer").__init__, 'name="iteration"')
    captured = source_has(resolve("tensorflow optimizer").__init__,
                          "self._distribution_strategy = tf.distribute.get_strategy()")
    return None if made is None or captured is None else made and captured


def adopt(obj: Any, strategy: Any, model: Any) -> None:
    """Makes the variables of `obj` (an optimizer or a metric) again under `strategy`.

    In place: the object keeps its identity, its variables keep their values,
    paths, dtypes and aggregation. Nothing happens when they already belong to
    `strategy`.

    Raises:
        ValueError: If `obj` is an optimizer already built outside `strategy`
            (its slots cannot be moved onto the model's replicas),
            or holds a variable this function could not replace.
    """
    if all(_in(strategy, v) for v in obj.variables):
        return
    import keras

    if isinstance(obj, keras.optimizers.Optimizer) and obj.built:
        raise ValueError(_refusal(obj, strategy, model, "it was already built outside that "
                                  "strategy (it trained, or build() was called), and its "
                                  "state cannot be moved onto the model's replicas"))
    for owner in _owners(obj):
        for old in [v for v in owner._variables if not _in(strategy, v)]:
            new = _made_in(strategy, old)
            # By identity: Keras's `Tracker.replace_tracked_value` finds `old` with `==`,
            # which compares values (another variable holding the same value matches).
            store = owner._variables
            store[next(i for i, v in enumerate(store) if v is old)] = new
            owner._tracker.stored_ids["variables"].discard(id(old))
            owner._tracker.stored_ids["variables"].add(id(new))
            for name, value in list(vars(owner).items()):
                if value is old:
                    setattr(owner, name, new)
        if hasattr(owner, "_distribution_strategy"):
            owner._distribution_strategy = strategy
    if not all(_in(strategy, v) for v in obj.variables):
        raise ValueError(_refusal(obj, strategy, model, "it keeps a variable made outside "
                                  "that strategy where kmp cannot replace it"))


def _keras_objects(value: Any) -> Iterator[Any]:
    """The optimizers and metrics in `compile`'s arguments (nested lists, tuples, dicts)."""
    import keras

    if isinstance(value, (keras.optimizers.Optimizer, keras.metrics.Metric)):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _keras_objects(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _keras_objects(item)


def _owners(obj: Any) -> Iterator[Any]:
    """`obj`, then the objects whose variables `obj.variables` also lists."""
    yield obj
    for metric in getattr(obj, "_metrics", ()):
        yield from _owners(metric)
    inner = getattr(obj, "inner_optimizer", None)  # LossScaleOptimizer
    if inner is not None:
        yield from _owners(inner)


def _in(strategy: Any, variable: Any) -> bool:
    return strategy.extended.variable_created_in_scope(getattr(variable, "value", variable))


def _made_in(strategy: Any, old: Any) -> Any:
    """A Keras variable like `old` (value, path, dtype, aggregation), made under `strategy`."""
    import keras

    parent = old.path.rpartition("/")[0]
    with strategy.scope(), keras.name_scope(parent) if parent else contextlib.nullcontext():
        return keras.Variable(old.numpy(), dtype=old.dtype, trainable=old.trainable,
                              aggregation=old.aggregation,
                              synchronization=getattr(old, "synchronization", "auto"),
                              name=old.name)


def _refusal(obj: Any, strategy: Any, model: Any, why: str) -> str:
    import keras

    kind = type(obj).__name__
    role = "optimizer" if isinstance(obj, keras.optimizers.Optimizer) else "metric"
    return (
        f"model.compile of model {model.name!r}: the {role} {kind} {obj.name!r} was made "
        f"outside the {type(strategy).__name__} the model was made under (by kmp.parallelize or "
        f"in strategy.scope()), and {why}. Pass a new {kind}(...) (or its name as a string), "
        f"or make it inside `with model.distribute_strategy.scope():`. Received: "
        f"{role}={kind}(name={obj.name!r})"
    )
