"""Keras patches to the TensorFlow trainer: multi-worker build and logs, steps_per_execution.

Each `patch_*` function applies one workaround and returns its undo; the
check after it says whether the installed Keras still has the code it fixes. The `PATCHES` table (`compat._registry`) names their upstream issues and
Keras versions. `refuse_unsupported_settings` is also used
by `parallelize` and the patches of `patches.loss_scale` and `patches.compile_settings`.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing
from keras_mgpu_plugins.backends.tensorflow.patches.input_check import (
    claim_full_batches,
    fetch_full_batch,
    single_steps,
)
from keras_mgpu_plugins.backends.tensorflow.rank import strategy_name
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require

# --- keras-team/keras#20585 (1/2): symbolic build reduces the per-replica batch ---


def patch_symbolic_build() -> Any:
    """The TensorFlow trainer's `_maybe_symbolic_build` takes one local replica's batch.

    Upstream reduces the first distributed batch with `strategy.reduce("MEAN",
    batch, axis=None)` to get example shapes; under MultiWorkerMirroredStrategy that
    reduce cannot take the nested per-replica input and `fit`, `evaluate` and
    `predict` fail before the first step. The batch is only needed for its
    shapes and dtypes, so the first local replica's part serves.

    Once the model, its compiled loss and metrics and its optimizer are built
    (every `fit` after the first), no batch is drawn: upstream still creates a
    distributed iterator and fetches a batch for a build that does nothing,
    which under MultiWorkerMirroredStrategy costs an iterator (tf.functions
    traced for its devices, a prefetch thread) on every `fit`/`evaluate` call.
    """
    import tensorflow as tf

    tree, trainer = resolve("tree"), resolve("tensorflow trainer")
    original = trainer._maybe_symbolic_build

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None or _all_built(self):
            return
        strategy = self.distribute_strategy
        peeked = _peeked_generator_batch(iterator)
        if peeked is not None:
            data_batch, iterator = peeked, None
        if iterator is not None:
            # Keras 3.5-3.6 yield (step, it) from enumerate_epoch(); 3.7-3.10 (step, it)
            # from the iterator; 3.11+ (begin, end, it).
            epoch = iterator.enumerate_epoch() if hasattr(iterator, "enumerate_epoch") else iterator
            for *_, it in epoch:
                data_batch = tree.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    next(it),
                )
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    trainer._maybe_symbolic_build = _maybe_symbolic_build
    return lambda: setattr(trainer, "_maybe_symbolic_build", original)


def _all_built(model: Any) -> bool:
    """Whether `_symbolic_build` has nothing left to build (the conditions upstream tests)."""
    return (all(layer.built for layer in model._flatten_layers())
            and getattr(model._compile_metrics, "built", True)
            and getattr(model._compile_loss, "built", True)
            and getattr(model.optimizer, "built", True))


def _peeked_generator_batch(iterator: Any) -> Any:
    """The first batch Keras peeked from a Python generator, or `None` for other inputs.

    Drawing it from a fresh iterator instead (then resetting) would lose the batches
    tf.data's prefetch pulled from the generator meanwhile, a timing-dependent number:
    workers would then train on halves of different global batches.
    """
    adapter = getattr(iterator, "data_adapter", None)
    if type(adapter).__name__ != "GeneratorDataAdapter":
        return None
    first = getattr(adapter, "_first_batches", None)
    return first[0] if first else None


# --- keras-team/keras#20585 (2/2): scalar logs reduced with axis=0 -----------------


def patch_reduce_per_replica() -> Any:
    """`reduce_per_replica` averages multi-worker logs element-wise across replicas.

    Upstream calls `strategy.reduce("MEAN", v, axis=0)` under multi-worker mode,
    which fails on the scalar losses and metrics that `train_step` returns (and
    would average over a batch axis for anything else). The mean across
    replicas is `axis=None`.
    """
    tree, tf_trainer = resolve("tree"), resolve("tensorflow trainer module")
    require("collective_all_reduce_multi_worker")
    multi_worker = resolve("collective_all_reduce_multi_worker")
    original = tf_trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and multi_worker(strategy):
            return tree.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values
            )
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica
    return lambda: setattr(tf_trainer, "reduce_per_replica", original)


def symbolic_build_reduces_batch() -> bool | None:
    method = resolve("tensorflow trainer").__dict__.get("_maybe_symbolic_build")
    return None if method is None else source_has(method, "reduce(", '"MEAN"')


def reduce_per_replica_uses_axis_0() -> bool | None:
    return source_has(resolve("tensorflow trainer module").reduce_per_replica,
                      'strategy.reduce("MEAN", v, axis=0)')


# --- keras-team/keras#19246: steps_per_execution > 1 under a distributing strategy -----


def refuse_unsupported_settings(model: Any) -> None:
    """Raises for a compile setting that would not train as on one device under distribution.

    Called when `fit`/`evaluate` build their step function (the first call after
    `compile`) under a strategy that spans replicas or workers.

    Raises:
        ValueError: For `gradient_accumulation_steps` with loss scaling
            (`mixed_float16`): float16 overflows in other micro-batches than on
            one device. For `jit_compile=True` with a model that overrides
            `train_step`: XLA compiles each replica's Keras `train_step` with
            the optimizer's update deferred until after it (`patches.compile_settings`), which
            a custom step may rely on (e.g. metrics of the updated weights); and
            with a synchronized BatchNormalization (no collective runs in XLA).
    """
    from keras_mgpu_plugins.compat._private import all_layers

    strategy = strategy_name(model.distribute_strategy)
    inner = getattr(getattr(model, "optimizer", None), "inner_optimizer", None)
    if inner is not None and getattr(inner, "gradient_accumulation_steps", None):
        raise ValueError(
            f"gradient_accumulation_steps={inner.gradient_accumulation_steps} with loss scaling "
            "(the mixed_float16 policy, or a LossScaleOptimizer) is not supported under "
            f"{strategy}: each replica scales its share of the loss before the loss scale, so "
            "float16 overflows in other micro-batches than on one device and the run ends "
            "elsewhere (measured: 0.065 off one device on 2 devices). Received: "
            f"gradient_accumulation_steps={inner.gradient_accumulation_steps}, "
            "LossScaleOptimizer. Use the mixed_bfloat16 policy (no loss scaling), or "
            "gradient_accumulation_steps=None with a larger batch."
        )
    if getattr(model, "_jit_compile", None) is not True:
        return
    synchronized = [layer.name for layer in all_layers(model) if getattr(layer, "synchronized", False)]
    if synchronized:
        raise ValueError(
            f"compile(jit_compile=True) with a synchronized BatchNormalization ({synchronized[0]}; "
            "parallelize(sync_batchnorm=True) sets synchronized=True) is not supported under "
            f"{strategy}: keras_mgpu_plugins compiles each replica's step with XLA, where the "
            "statistics' all-reduce cannot run. Received: jit_compile=True. Use "
            "jit_compile=False (or 'auto'), or sync_batchnorm=False."
        )
    if type(model).train_step is not resolve("tensorflow trainer").train_step:
        raise ValueError(
            f"compile(jit_compile=True) with a model that overrides train_step "
            f"({type(model).__name__}.train_step) is not supported under "
            f"{strategy}: keras_mgpu_plugins compiles each "
            "replica's Keras train_step with XLA and runs the all-reduce and the optimizer "
            "after it, which a custom train_step may not allow. Received: jit_compile=True. "
            "Use jit_compile=False (or 'auto'), and put tf.function(jit_compile=True) around "
            "the forward and backward pass inside your train_step."
        )


def patch_steps_per_execution() -> Any:
    """`steps_per_execution > 1` fails under MirroredStrategy and MultiWorkerMirroredStrategy.

    Upstream's `multi_step_on_iterator` runs each step inside a `tf.cond` (guarding
    against an exhausted iterator) inside its `tf.while_loop`. `strategy.run` in
    that cond branch leaves an uncaptured placeholder: "You must feed a value for
    placeholder tensor 'while/cond/Placeholder_1'". The loop's own condition
    already checks that the next input exists and that fewer than N steps ran,
    so under a distributing strategy the step runs unconditionally in the loop
    body; only fetching the next input stays in a `tf.cond` (it must not consume
    a batch beyond the N-th). Other strategies keep upstream's function.

    The logs are reduced across replicas once per execution, after the loop:
    upstream reduces them after every step, which under
    MultiWorkerMirroredStrategy is one more cross-worker collective per step
    (and a host round trip's worth of latency) for values that only the last
    step's survive. The metrics are running means, so the last step's
    per-replica values reduced once are exactly what upstream returns.

    An execution whose inputs are all full batches of arrays on several workers
    fetches them without TensorFlow's per-step cross-worker input check
    (`patches.input_check`, its own patch: without it, every execution checks).
    """
    import tensorflow as tf

    trainer, tf_trainer = resolve("tensorflow trainer"), resolve("tensorflow trainer module")
    original = trainer._make_function

    def _make_function(self, step_function):
        if not distributing(self.distribute_strategy):
            return original(self, step_function)
        refuse_unsupported_settings(self)
        if self.run_eagerly:
            return original(self, step_function)
        if self.steps_per_execution == 1:
            return single_steps(self, original(self, step_function), step_function)
        if getattr(self, "unrolled_steps_per_execution", 1) != 1:
            raise ValueError(
                "unrolled_steps_per_execution > 1 is not supported by keras_mgpu_plugins "
                f"under {strategy_name(self.distribute_strategy)} "
                "(keras-team/keras#19246). Received: "
                f"unrolled_steps_per_execution={self.unrolled_steps_per_execution}; "
                "leave it at 1 (steps_per_execution works)."
            )
        strategy = self.distribute_strategy

        def one_step_on_data(data):
            outputs = strategy.run(step_function, args=(data,))
            return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

        def one_step_unreduced(data):  # the loop's step: its logs are reduced after the loop
            return strategy.run(step_function, args=(data,))

        autoconvert = getattr(self, "_autoconvert_optionals", lambda f: f)
        one_step = autoconvert(
            tf.function(one_step_on_data, reduce_retracing=True, jit_compile=self.jit_compile))
        loop_step = autoconvert(
            tf.function(one_step_unreduced, reduce_retracing=True, jit_compile=self.jit_compile))

        def steps_on_iterator(fetch):
            def multi_step_on_iterator(iterator):
                n = self.steps_per_execution
                empty = tf.experimental.Optional.empty(None)  # spec set while tracing the body

                def cond(step, outputs, inputs):
                    return tf.logical_and(tf.less(step, n), inputs.has_value())

                def body(step, outputs, inputs):
                    new = tf.experimental.Optional.from_value(loop_step(inputs.get_value()))
                    empty._element_spec = new.element_spec
                    following = tf.cond(tf.less(step + 1, n), lambda: fetch(iterator),
                                        lambda: inputs)
                    return step + 1, new, following

                _, final, _ = tf.while_loop(cond, body, [tf.constant(0), empty, fetch(iterator)])
                final._element_spec = empty.element_spec
                return final

            return tf.function(tf.autograph.experimental.do_not_convert(multi_step_on_iterator),
                               reduce_retracing=True)

        multi_step = steps_on_iterator(lambda iterator: iterator.get_next_as_optional())
        # Executions of full batches only, on several workers (`patches.input_check`).
        full_batch_steps = steps_on_iterator(fetch_full_batch)
        reduce_logs = tf.function(  # once per execution, on every worker: has_value agrees
            lambda outputs: tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto"),
            reduce_retracing=True)

        def function(iterator):
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                full = claim_full_batches(iterator, self.steps_per_execution, strategy)
                outputs = (full_batch_steps if full else multi_step)(iterator)
                if not outputs.has_value():
                    raise StopIteration
                return reduce_logs(outputs.get_value())
            for _, data in zip(range(self.steps_per_execution), iterator, strict=False):
                outputs = one_step(data)
            return outputs

        function._kmp_step_loop = multi_step  # for tests: the traced loop of one execution
        function._kmp_full_batch_loop = full_batch_steps
        return function

    trainer._make_function = _make_function
    return lambda: setattr(trainer, "_make_function", original)


def multi_step_conds_the_step() -> bool | None:
    return source_has(resolve("tensorflow trainer module"), "tf.cond(", "has_next",  # the module: _make_function may be patched
                       "one_step_on_data(next_optional_inputs.get_value())")
