"""The private Keras API kmp's parameter-server loop relies on (private use
`parameter_server_trainer`, `kmp.compat`).

- `build_in_scope`: every variable the steps need, made on the parameter servers
  before any step (`Trainer._symbolic_build`): a closure may not create variables on a
  worker;
- `strategy_of`: the strategy a model was built in (`TensorFlowTrainer._distribute_strategy`);
- `OnTheChief`: Keras's own `evaluate`/`predict` run on the chief under TensorFlow's
  default strategy (that attribute set to `None` meanwhile);
- `initial_epoch`: the epoch a `BackupAndRestore` restored (`Model._initial_epoch`).
"""

from __future__ import annotations

import inspect
from typing import Any

from keras_mgpu_plugins.compat._checks import source_has
from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require


def strategy_of(model: Any) -> Any:
    """The `tf.distribute` strategy `model` was built in (`None`: TensorFlow's default)."""
    return getattr(model, "_distribute_strategy", None)


def build_in_scope(model: Any, strategy: Any, element: Any) -> None:
    """Creates every variable the steps need (layers, compiled metrics and loss, optimizer)
    in `strategy`'s scope, from one batch's shapes (`Trainer._symbolic_build`): under
    parameter servers no closure may create a variable on a worker."""
    from keras_mgpu_plugins.backends.tensorflow.patches.trainer import _all_built

    if _all_built(model):
        return
    require("parameter_server_trainer")
    with strategy.scope():
        model._symbolic_build(data_batch=element)


def initial_epoch(model: Any, given: int) -> int:
    """The epoch `fit` starts at: a `BackupAndRestore`'s restored one (set at train begin in
    `model._initial_epoch`, as Keras's own fit reads it), else `given`."""
    require("initial_epoch")
    return getattr(model, "_initial_epoch", None) or given


class OnTheChief:
    """Within it, `model` runs under TensorFlow's default strategy on the chief itself:
    Keras's own `evaluate` and `predict` then read the variables from the parameter servers
    and compute on the chief (Keras's `TensorFlowTrainer._distribute_strategy`)."""

    def __init__(self, model: Any) -> None:
        require("parameter_server_trainer")
        self.model = model

    def __enter__(self) -> Any:
        self.strategy, self.model._distribute_strategy = self.model._distribute_strategy, None
        return self.strategy

    def __exit__(self, *exc: Any) -> None:
        self.model._distribute_strategy = self.strategy


def check_trainer() -> list[str]:
    """What `parameter_server_trainer` needs of Keras's TensorFlow trainer."""

    problems = []
    prop = resolve("tensorflow trainer").__dict__.get("distribute_strategy")
    if source_has(getattr(prop, "fget", None), "self._distribute_strategy or") is not True:
        problems.append("TensorFlowTrainer.distribute_strategy no longer falls back from "
                        "self._distribute_strategy to the current strategy")
    build = getattr(resolve("base trainer"), "_symbolic_build", None)
    if build is None or "data_batch" not in inspect.signature(build).parameters:
        problems.append("Trainer._symbolic_build(data_batch=...) is gone")
    return problems
