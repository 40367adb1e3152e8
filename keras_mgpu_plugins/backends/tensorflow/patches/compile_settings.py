"""Keras patches for compile under tf.distribute: gradient accumulation, XLA, compiling again.

`patch_gradient_accumulation` (keras-team/keras#20582) moves the accumulation's
`cond` out of the replica context; `patch_jit_compile` (keras-team/keras#19005)
compiles each replica's step with XLA and leaves the all-reduce and the
optimizer outside it; `patch_compile_in_model_scope` runs a `compile` outside
any strategy scope in the scope of the strategy the model was made under. All
apply only under a strategy that spans replicas or workers (`distributing`);
one device keeps Keras's code.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches import row_weights
from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing
from keras_mgpu_plugins.backends.tensorflow.patches.optimizer import clips, overwrite_with_ema
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve

# --- gradient_accumulation_steps: the update's merge_call runs inside a replica-context cond ---


def patch_gradient_accumulation() -> Any:
    """`gradient_accumulation_steps` fails under MirroredStrategy and MultiWorkerMirroredStrategy.

    Upstream's `_backend_apply_gradients` picks "apply" or "accumulate" with a
    `cond` in the replica context; both branches call `merge_call` (the
    all-reduce and the variable updates), which TensorFlow refuses inside a
    `cond`: "`merge_call` called while defining a new graph or a tf.function".

    Under a distributing strategy each replica adds its gradients to its own
    accumulator copy (no collective) and computes its share of the update,
    `(accumulated + gradients) / steps`, clipped as upstream clips it. One
    `merge_call` then enters the cross-replica context, where a `cond` on the
    optimizer's iteration count (the same on every replica and worker, so every
    worker takes the same branch) either all-reduces those shares once and
    applies them (weight decay, `update_step`, accumulators reset), or stores
    the running sums. Each replica's loss is already scaled by
    1/replicas, so the all-reduced sum is the update one device computes by
    accumulating the same global micro-batches. With clipping set, each
    micro-batch's gradients are all-reduced first (the accumulators then hold
    global sums) so that the global update is clipped, not each replica's share;
    the EMA overwrite's `cond` runs cross-replica (`patches.optimizer`).
    """
    import tensorflow as tf

    variable_class, tf_optimizer = resolve("backend variable"), resolve("tensorflow optimizer")
    original = tf_optimizer._backend_apply_gradients

    def _backend_apply_gradients(self, grads, trainable_variables):
        context = tf.distribute.get_replica_context()
        strategy = self._distribution_strategy
        if not self.gradient_accumulation_steps or context is None or not distributing(strategy):
            return original(self, grads, trainable_variables)
        steps = self.gradient_accumulation_steps
        accumulators = [self._accumulated_gradients[self._get_variable_index(v)].value
                        for v in trainable_variables]
        if clips(self):  # clip the global sum, as one device does: all-reduce each micro-batch
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
        sums = [tf.convert_to_tensor(g) + a for g, a in zip(grads, accumulators, strict=True)]
        shares = self._clip_gradients([s / steps for s in sums])
        context.merge_call(_apply_or_accumulate,
                           args=(self, list(trainable_variables), accumulators, sums, shares))
        if self.use_ema:  # as upstream does after its cond
            self._update_model_variables_moving_average(self._trainable_variables)
            overwrite_with_ema(self, context)

    def _apply_or_accumulate(distribution, optimizer, keras_variables, accumulators, sums, shares):
        variables = [v.value if isinstance(v, variable_class) else v for v in keras_variables]

        def apply():
            reduced = shares if clips(optimizer) else distribution.extended.batch_reduce_to(
                tf.distribute.ReduceOp.SUM, list(zip(shares, variables, strict=True)))
            if optimizer.weight_decay is not None:
                for keras_variable, variable in zip(keras_variables, variables, strict=True):
                    if optimizer._use_weight_decay(keras_variable):
                        distribution.extended.update(variable, _decay, args=(optimizer,),
                                                     group=False)
            optimizer._distributed_tf_update_step(
                distribution, list(zip(reduced, variables, strict=True)), optimizer.learning_rate)
            for accumulator in accumulators:
                distribution.extended.update(accumulator, lambda a: a.assign(tf.zeros_like(a)),
                                             group=False)

        def accumulate():
            for accumulator, total in zip(accumulators, sums, strict=True):
                distribution.extended.update(accumulator, lambda a, t: a.assign(t), args=(total,),
                                             group=False)

        steps = optimizer.gradient_accumulation_steps
        # `_iterations` counts micro-batches (`iterations` counts updates): upstream's test.
        tf.cond(tf.equal((optimizer._iterations + 1) % steps, 0), apply, accumulate)

    def _decay(variable, optimizer):
        lr = tf.cast(optimizer.learning_rate, variable.dtype)
        variable.assign_sub(variable * tf.cast(optimizer.weight_decay, variable.dtype) * lr)

    tf_optimizer._backend_apply_gradients = _backend_apply_gradients
    return lambda: setattr(tf_optimizer, "_backend_apply_gradients", original)


def accumulation_merges_inside_cond() -> bool | None:
    return source_has(resolve("base optimizer")._backend_apply_gradients,
                      "ops.cond(", "_backend_increment_gradient_accumulators")


# --- jit_compile=True: XLA compiles the whole multi-replica step ------------------------

_recording = threading.local()  # the apply_gradients calls an XLA-compiled step deferred


def patch_jit_compile() -> Any:
    """`compile(jit_compile=True)` fails under MirroredStrategy and MultiWorkerMirroredStrategy.

    Upstream wraps the function that calls `strategy.run` in
    `tf.function(jit_compile=True)`, so XLA gets every replica's step in one
    cluster on one device ("Trying to access resource ... located in device
    CPU:1 from device CPU:0"; on several workers an UnimplementedError). Its
    `predict` already compiles each replica's step instead.

    Under a distributing strategy the function around `strategy.run` is left to
    TensorFlow, and each replica runs its `train_step`/`test_step` in its own
    XLA function, with no collective inside: Keras variable writes (metrics,
    batch-norm statistics, seeds) are collected in a `StatelessScope` and the
    `optimizer.apply_gradients` call is recorded, not run. Outside XLA, still
    per replica, the writes are assigned and the gradients applied: the
    all-reduce and the update run as without XLA. Only Keras's own `train_step`
    is compiled this way (it uses nothing after `apply_gradients` but the
    metrics of the forward pass); an overriding one is refused with
    `jit_compile=True` (`refuse_unsupported_settings`).
    """
    trainer, base_optimizer = resolve("tensorflow trainer"), resolve("base optimizer")
    original = trainer._make_function
    original_apply_gradients = base_optimizer.apply_gradients

    def apply_gradients(self, grads_and_vars):
        pending = getattr(_recording, "pending", None)
        if pending is None:
            return original_apply_gradients(self, grads_and_vars)
        pending.append((self, list(grads_and_vars)))
        return self._iterations

    def _make_function(self, step_function):
        if (self.run_eagerly or self.jit_compile is not True
                or not distributing(self.distribute_strategy)):
            return original(self, step_function)
        from keras_mgpu_plugins.backends.tensorflow.patches.trainer import (
            refuse_unsupported_settings,
        )

        refuse_unsupported_settings(self)
        self._jit_compile = False  # upstream's function around strategy.run: no XLA
        try:
            return original(self, _xla_per_replica(self, step_function))
        finally:
            self._jit_compile = True

    base_optimizer.apply_gradients = apply_gradients
    trainer._make_function = _make_function

    def undo():
        base_optimizer.apply_gradients = original_apply_gradients
        trainer._make_function = original

    return undo


def _xla_per_replica(model: Any, step_function: Any) -> Any:
    """`step_function` with its stateless part compiled by XLA, its state written after."""
    import tensorflow as tf

    stateless_scope = resolve("stateless scope")
    traced: dict[str, Any] = {}  # the Python side of the last trace (the same for every one)
    # A step whose losses `patches.row_weights` weighs by rows: its weight is a collective,
    # computed outside XLA and passed in.
    weight_of = getattr(step_function, "weight_of", None)
    step_function = getattr(step_function, "unweighted", step_function)

    @tf.function(jit_compile=True, reduce_retracing=True)
    def compiled(data, weight):
        _recording.pending = pending = []
        try:
            with stateless_scope() as scope, row_weights.weighted(weight):
                outputs = step_function(data)
        except RuntimeError as err:
            if "merge_call" not in str(err):
                raise
            raise ValueError(
                "compile(jit_compile=True) under tf.distribute: the step synchronizes replicas "
                "(a collective in the forward pass), and keras_mgpu_plugins compiles each "
                "replica's step with XLA, where no collective can run. Received: "
                "jit_compile=True. Use jit_compile=False (or 'auto').") from err
        finally:
            _recording.pending = None
        candidates = {id(v): v for v in (list(model.variables) + list(model.metrics_variables)
                                         + [v for opt, _ in pending for v in opt.variables])}
        written = [v for key, v in candidates.items() if key in scope.state_mapping]
        if len(written) != len(scope.state_mapping):
            raise RuntimeError(
                "jit_compile=True under tf.distribute: the step wrote a variable that is not "
                "the model's, its metrics' or its optimizer's; keras_mgpu_plugins cannot carry "
                "that write out of the XLA function. Use jit_compile=False.")
        traced["written"] = written
        traced["applies"] = [(opt, [v for _, v in pairs]) for opt, pairs in pending]
        grads = [[g for g, _ in pairs] for _, pairs in pending]
        return outputs, grads, [scope.get_current_value(v) for v in written]

    def per_replica(data):
        outputs, grads, values = compiled(data, None if weight_of is None else weight_of(data))
        for variable, value in zip(traced["written"], values, strict=True):
            variable.assign(value)
        for (optimizer, variables), gradients in zip(traced["applies"], grads, strict=True):
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return outputs

    return per_replica


def jit_compiles_the_distributed_step() -> bool | None:
    # The module's source: `_make_function` itself may be another patch's by now.
    return source_has(resolve("tensorflow trainer module"), "self.distribute_strategy.run(step_function",
                      "jit_compile=self.jit_compile")


# --- compile outside the strategy's scope: the loss tracker is made of plain variables ---


def patch_compile_in_model_scope() -> Any:
    """A model compiled again outside its strategy's scope logs each worker's own loss.

    Keras's `compile` makes the loss tracker (a `Mean` metric) at once, in
    whatever scope is current. A model made under MultiWorkerMirroredStrategy
    (by `@kmp.parallelize`, or in `strategy.scope()`) and compiled again outside
    it (fine-tuning: freeze, compile, fit) got a tracker of plain variables:
    each worker logged the loss of its own share of the batch, not the global
    batch's (0.64 and 1.04 on the two workers where one process logs 0.81;
    weights and the compiled metrics were right). A callback monitoring "loss"
    (EarlyStopping, ReduceLROnPlateau, `save_best_only`) then decides
    differently on each worker. Keras 2 in TensorFlow compiled in the model's
    strategy scope. Under MirroredStrategy both replicas update the plain
    variables, which happens to give the right mean; with several workers it
    does not. No upstream issue found.

    When no strategy scope is active and the model was made under a
    distributing strategy, `compile` runs in that strategy's scope.
    """
    import tensorflow as tf

    # Replaced on the base trainer, not on the TensorFlow one: `compile_from_config`
    # (loading a compiled model) compiles only if `type(model).compile is Trainer.compile`.
    trainer = resolve("base trainer")
    original = trainer.compile

    @functools.wraps(original)
    def compile(self, *args, **kwargs):
        strategy = getattr(self, "_distribute_strategy", None)
        if strategy is None or tf.distribute.has_strategy() or not distributing(strategy):
            return original(self, *args, **kwargs)
        with strategy.scope():
            return original(self, *args, **kwargs)

    trainer.compile = compile
    return lambda: setattr(trainer, "compile", original)


def compile_makes_loss_tracker_in_current_scope() -> bool | None:
    return source_has(resolve("base trainer").compile, 'self._loss_tracker = metrics_module.Mean(name="loss")')
