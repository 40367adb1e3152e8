"""Keras patches for models with their own `train_step` under a distributing strategy.

Two records of the `PATCHES` table (`compat._registry`): a `Model` subclass
without `call()` is built by its step as on one device, and the log values a
step returns that are losses Keras scaled by 1/replicas for the gradient sum
are unscaled per replica, so the logs are one device's.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

from keras_mgpu_plugins.backends.tensorflow.patches import row_weights
from keras_mgpu_plugins.backends.tensorflow.patches.distributing import distributing
from keras_mgpu_plugins.backends.tensorflow.rank import strategy_name
from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve

# --- keras-team/keras#21800: the distributed symbolic build calls the model ---------


def patch_build_without_call() -> Any:
    """Under a strategy, `fit` calls the model before the first step, which needs `call()`.

    Keras builds the model, its metrics and optimizer up front under a
    distributing strategy by running `self(x)` symbolically
    (`_symbolic_build`); a `Model` subclass that only defines `train_step`
    and `test_step` (keras.io's knowledge-distillation `Distiller`) has no
    `call()` and fails with "Unable to automatically build the model". Without
    a strategy Keras builds nothing up front: the step creates what it uses
    (metrics, optimizer variables) when it is first traced. For such a model
    the optimizer is built in the strategy's scope, as upstream builds it for
    a model with `call()` (with every trainable variable: slots for variables
    the step never updates, e.g. a distiller's teacher, stay unused), and the
    metrics are left to the step, which creates them mirrored from the replica
    context. Where a layer is not built yet, the optimizer is left to the step
    too (an optimizer with slot variables, Adam, then fails in TensorFlow:
    build the layers in the factory).
    """
    import keras

    trainer = resolve("tensorflow trainer")
    original = trainer._maybe_symbolic_build

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if type(self).call is not keras.Model.call or self._distribute_strategy is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        optimizer = self.optimizer
        if (optimizer is not None and not optimizer.built
                and all(layer.built for layer in self._flatten_layers(include_self=False))):
            with self.distribute_strategy.scope():  # as upstream builds it, before the step
                optimizer.build(self.trainable_variables)
        return None

    trainer._maybe_symbolic_build = _maybe_symbolic_build
    return lambda: setattr(trainer, "_maybe_symbolic_build", original)


def symbolic_build_calls_the_model() -> bool | None:
    return source_has(resolve("base trainer")._symbolic_build, "compute_output_spec(self, x",
                      "Unable to automatically build the model")


# --- log values of a custom step: losses scaled by 1/replicas ------------------------

_SCALED, _UNSCALED = "scaled", "unscaled"
#: graph -> {"scaled" | "unscaled": names of the tensors Keras scaled or unscaled in it}
_marked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
CLEAN, CONST, SCALED = "clean", "const", "scaled"  # kinds; anything else: the op it stopped at
_LINEAR_FIRST = {"Identity", "Cast", "Neg", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                 "Snapshot", "Sum", "Mean", "PreventGradient", "EnsureShape"}
_SUMS = {"Add", "AddV2", "Sub", "AddN"}
_DIVISIONS = {"RealDiv", "Div", "DivNoNan", "TrueDiv"}
_warned: set[tuple[str, str]] = set()


def patch_scaled_loss_logs() -> Any:
    """A custom `train_step`/`test_step` logs its losses divided by the replicas.

    Keras scales a `keras.losses.Loss` value by 1/replicas in the replica
    context (`scale_loss_for_distribution`), so that the all-reduced gradients
    are the global batch's; its own `train_step` unscales what it logs, a
    custom one (keras.io's distiller: `"student_loss": student_loss`; Keras's
    guide: `loss_tracker.update_state(loss)`) logs the scaled value, which the
    mean across replicas leaves halved on 2 replicas. While the step is traced,
    each value it returns, and each value fed to a `keras.metrics.Mean`, is
    classified from its graph: a linear function of scaled losses (sums, and
    products and quotients by constants) is multiplied back by the replicas
    in each replica, so the mean across replicas and workers is their sum:
    the global batch's value for equal shares. Values that do not depend on a
    scaled loss (metric results) are unchanged; any other function of one
    (`exp(loss)`) is warned about once, naming its key.

    Where `patches.row_weights` weighs each replica's loss by its rows (a
    global batch that may not split evenly), the replicas' values still sum
    to the global batch's, so the same product by the replicas holds; a
    value fed to a `Mean` with a `sample_weight` (Keras's own loss tracker
    passes the rows) is unscaled as Keras unscales, to the replica's own
    value; and an unscaled loss fed with none (Keras's per-output losses of
    a multi-output model, when the batch size is not static) is brought to
    the replica's share times the replicas, so the mean across replicas is
    the global batch's value.
    """
    trainer, loss_module = resolve("tensorflow trainer"), resolve("loss module")
    mean = resolve("reduction metrics module").Mean
    scale, unscale = loss_module.scale_loss_for_distribution, loss_module.unscale_loss_for_distribution
    update_state = mean.update_state
    make_function = trainer._make_function

    def scale_loss_for_distribution(value):
        return _mark(scale(value), value, _SCALED)

    def unscale_loss_for_distribution(value):
        return _mark(unscale(value), value, _UNSCALED)

    def mean_update_state(self, values, sample_weight=None):
        what = f"{self.name} (a keras.metrics.Mean fed in the step)"
        if sample_weight is None:
            values = _equal_share(_unscaled(values, what, _times_replicas))
        else:
            values = _unscaled(values, what, unscale)
        return update_state(self, values, sample_weight=sample_weight)

    def _make_function(self, step_function):
        if distributing(self.distribute_strategy):
            step_function = _unscaling_logs(self, step_function)
        return make_function(self, step_function)

    loss_module.scale_loss_for_distribution = scale_loss_for_distribution
    loss_module.unscale_loss_for_distribution = unscale_loss_for_distribution
    mean.update_state = mean_update_state
    trainer._make_function = _make_function

    def undo():
        loss_module.scale_loss_for_distribution = scale
        loss_module.unscale_loss_for_distribution = unscale
        mean.update_state = update_state
        trainer._make_function = make_function

    return undo


def losses_scaled_for_distribution() -> bool | None:
    return source_has(resolve("loss module").reduce_values, "scale_loss_for_distribution(loss)")


def _mark(out: Any, value: Any, attribute: str) -> Any:
    """Records `out` (a graph tensor Keras scaled or unscaled) for its graph."""
    import tensorflow as tf

    if out is not value and tf.is_tensor(out) and hasattr(out, "graph") and hasattr(out, "op"):
        _marked.setdefault(out.graph, {}).setdefault(attribute, set()).add(out.name)
    return out


def _unscaling_logs(model: Any, step_function: Any) -> Any:
    tree = resolve("tree")
    owner = type(model).__name__

    def step(data):
        logs = step_function(data)
        if isinstance(logs, dict):
            return {key: tree.map_structure(
                lambda v, key=key: _unscaled(v, f"{key!r} of {owner}'s logs", _times_replicas),
                value) for key, value in logs.items()}
        return tree.map_structure(lambda v: _unscaled(v, f"the output of {owner}'s step",
                                                      _times_replicas), logs)

    return step


def _times_replicas(value: Any) -> Any:
    """`value` times the replicas in sync: for a replica's share of a global value (its loss
    scaled for the gradient sum), what the mean across replicas makes that global value."""
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return value * tf.cast(replicas, value.dtype) if replicas > 1 else value


def _equal_share(value: Any) -> Any:
    """An unscaled loss (a replica's own value), fed to a `Mean` with no weight in a step whose
    losses `patches.row_weights` weighs by rows: that weight times the replicas, so the mean
    across replicas is the global batch's value. Anything else: as given."""
    import tensorflow as tf

    weight = row_weights.current_weight()
    if (weight is None or not tf.is_tensor(value) or not hasattr(value, "graph")
            or value.name not in _marked.get(value.graph, {}).get(_UNSCALED, ())):
        return value
    return _times_replicas(value * tf.cast(weight, value.dtype))


def _unscaled(value: Any, what: str, unscale: Any) -> Any:
    """`value` times the replicas where it is a linear function of scaled losses."""
    import tensorflow as tf

    if not (tf.is_tensor(value) and hasattr(value, "op") and hasattr(value, "graph")):
        return value
    if _SCALED not in _marked.get(value.graph, {}):
        return value  # nothing was scaled in this graph
    kind = classify(value)
    if kind == SCALED:
        return unscale(value)
    if kind not in (CLEAN, CONST):
        _warn_unclassified(what, kind)
    return value


def classify(tensor: Any) -> str:
    """What `tensor` is, from its graph: `CLEAN` (no scaled loss in it), `CONST` (constants
    only), `SCALED` (a sum of scaled losses times constants), else the op type at which
    it stopped being one."""
    marked = _marked.get(tensor.graph, {})
    scaled, unscaled = marked.get(_SCALED, set()), marked.get(_UNSCALED, set())
    kinds: dict[str, str] = {}
    stack = [tensor]
    while stack:
        t = stack[-1]
        if t.name in kinds:
            stack.pop()
            continue
        if t.name in scaled or t.name in unscaled:
            kinds[t.name] = SCALED if t.name in scaled else CLEAN
            stack.pop()
            continue
        pending = [i for i in t.op.inputs if i.name not in kinds]
        if pending:
            stack.extend(pending)
            continue
        kinds[t.name] = _kind_of(t.op, [kinds[i.name] for i in t.op.inputs])
        stack.pop()
    return kinds[tensor.name]


def _kind_of(op: Any, inputs: list[str]) -> str:
    if not inputs:
        return CONST if op.type == "Const" else CLEAN
    if all(k == CONST for k in inputs):
        return CLEAN if op.op_def.is_stateful else CONST
    if SCALED not in inputs:
        return next((k for k in inputs if k not in (CLEAN, CONST)), CLEAN)
    if any(k not in (CLEAN, CONST, SCALED) for k in inputs):
        return next(k for k in inputs if k not in (CLEAN, CONST, SCALED))
    if op.type in _LINEAR_FIRST and inputs[0] == SCALED and SCALED not in inputs[1:]:
        return SCALED
    if op.type in _SUMS and all(k == SCALED for k in inputs):
        return SCALED
    if op.type == "Mul" and sorted(inputs) == [CONST, SCALED]:
        return SCALED
    if op.type in _DIVISIONS and inputs == [SCALED, CONST]:
        return SCALED
    return op.type


def _warn_unclassified(what: str, op_type: str) -> None:
    import tensorflow as tf

    key = (what, op_type)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(
        f"keras_mgpu_plugins: {what} depends on a loss that Keras divided by the number of "
        f"replicas for the gradient all-reduce (under {strategy_name(tf.distribute.get_strategy())}"
        f"), through a {op_type} op: it is not a sum of such losses times constants, so it "
        "cannot be brought back to one device's value, and the value logged is the mean of "
        "each replica's. Log the loss itself (or a keras.metrics.Mean fed with it) and compute "
        f"{op_type} from the logged value.", UserWarning, stacklevel=2)
