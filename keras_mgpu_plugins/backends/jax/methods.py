"""Keras's own `Model.fit`, `evaluate` and `predict` (and `compile`, `*_on_batch`), for the
models `@kmp.parallelize` built on JAX: run under the model's distribution, inputs
arranged as on one device (`inputs.arrays`, each process's share of every global batch
cut by `backends.jax.feeding`).

The patch `jax_inputs_as_on_one_device` wraps these methods once, on `keras.Model`, for
every model: a model kmp did not build (`backends.jax.models`) runs Keras's method
untouched. A class that overrides `fit` (a keras-hub task, a user's subclass) runs its
override first; its call to `super().fit(...)` is the one arranged, its arguments read
as Keras's own `Model.fit` defines them, whatever the override's signature.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from keras_mgpu_plugins import _keras_writers
from keras_mgpu_plugins.backends.jax import batches, feeding, models
from keras_mgpu_plugins.backends.jax.runtime import JaxRuntime
from keras_mgpu_plugins.inputs import arrays
from keras_mgpu_plugins.runtime import apart, calls

_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD
_ARRANGED = {"fit": arrays.fit_arguments, "evaluate": arrays.evaluate_arguments,
             "predict": arrays.predict_arguments}
_SCOPED = ("train_on_batch", "test_on_batch", "predict_on_batch")


def run_under(model: Any, distribution: Any) -> None:
    """Makes `model`'s fit/evaluate/predict (and compile, `*_on_batch`) run under
    `distribution`, fed as on one device. Registered changes `jax_inputs_as_on_one_device`,
    `jax_compile_under_model_distribution`, `jax_partial_batches_replicated` and, with several
    processes,
    `jax_predict_outputs_gathered` (`kmp.compat`)."""
    import jax

    from keras_mgpu_plugins.compat import apply, apply_to

    batches.own(distribution)
    models.register(model, distribution, apply("jax_partial_batches_replicated"))
    apply("jax_inputs_as_on_one_device")
    apply("jax_compile_under_model_distribution")
    if jax.process_count() > 1:
        apply_to("jax_predict_outputs_gathered", model, distribution)


def wrap_methods() -> Any:
    """The patch: Keras's `Model.fit`/`evaluate`/`predict` arranged, the `*_on_batch` methods
    scoped, for the models kmp built; returns the undo."""
    import keras

    from keras_mgpu_plugins.compat._record import replace

    undo = [replace(keras.Model, name, _arranged(name, getattr(keras.Model, name)))
            for name in _ARRANGED]
    undo += [replace(keras.Model, name, _scoped(getattr(keras.Model, name))) for name in _SCOPED]
    return lambda: [u() for u in reversed(undo)]


def wrap_compile() -> Any:
    """The patch `jax_compile_under_model_distribution`: Keras's own `compile`, where Keras
    defines it (Keras's `compile_from_config` takes a model whose class's `compile` is not
    that one for an override and skips it when loading), scoped as above; the undo."""
    from keras_mgpu_plugins.compat._record import replace

    owner = _owner("compile")
    return replace(owner, "compile", _scoped(vars(owner)["compile"]))


def _arranged(name: str, original: Any) -> Any:
    signature = _keras_signature(name)
    arrange = _ARRANGED[name]

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = models.arranged(self)
        if found is None:
            return original(self, *args, **kwargs)
        distribution = found.distribution
        if kwargs.get("_use_cached_eval_dataset"):  # fit's validation: already this process's
            with distribution.scope():
                return original(self, *args, **kwargs)
        cpus = _cpu_devices_of_this_process(distribution)
        if cpus > 1:
            _refuse_eager(self, name, cpus)
        runtime = JaxRuntime.for_model(self)
        calls.together(runtime, name, self)  # every process, or all raise
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in signature.parameters}
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items()
                     if k != "self" and signature.parameters[k].kind != _VAR_KEYWORD}
        if name == "fit":  # one process too: a writer this environment cannot run, refused
            _keras_writers.check_installed(apart.given_callbacks(arguments.get("callbacks")))
        with distribution.scope():
            arrange(arguments, feeding.JaxSharing(runtime, distribution, found.partial))
            return original(self, **arguments, **extra)

    return method


def _scoped(original: Any) -> Any:
    compiles = original.__name__ == "compile"

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = models.arranged(self)
        if found is None:
            return original(self, *args, **kwargs)
        with found.distribution.scope():
            result = original(self, *args, **kwargs)
        if compiles:  # an optimizer or metrics the user made outside it (fine-tuning)
            _lay_out(_optimizer_variables(getattr(self, "optimizer", None))
                     + _metric_variables((args, kwargs)), found.distribution)
        return result

    return method


def _keras_signature(name: str) -> inspect.Signature:
    """The signature of Keras's own `Model.<name>` (the trainer class that defines it), however
    kmp or a subclass wraps it."""
    return inspect.signature(vars(_owner(name, skip_model=True))[name])


def _owner(name: str, skip_model: bool = False) -> type:
    """The Keras class whose own `name` `keras.Model` inherits (`keras.Model` itself where it
    defines it, unless `skip_model`: kmp's wrappers are set there)."""
    import keras

    for owner in keras.Model.__mro__[1 if skip_model else 0:]:
        if name in vars(owner):
            return owner
    raise AttributeError(f"keras.Model has no {name}")


def _lay_out(variables: list, distribution: Any) -> None:
    """Lays out, as the distribution does a variable created under it, the variables made
    outside it that `compile` was given (an optimizer's `iterations` and learning rate, a
    metric's totals); an optimizer's slots are made in `fit`, under the distribution."""
    from keras_mgpu_plugins.compat._private import jax_relayout

    mesh = distribution.device_mesh.backend_mesh
    for variable in variables:
        sharding = getattr(variable.value, "sharding", None)
        if getattr(sharding, "mesh", None) != mesh:
            jax_relayout(variable, distribution.get_variable_layout(variable))


def _metric_variables(arguments: Any) -> list:
    """The variables of the metric objects among `compile`'s arguments (Keras adopts them as
    they are when it first builds its compiled metrics, in `fit`)."""
    import keras

    found = []
    for leaf in keras.tree.flatten(arguments):
        if isinstance(leaf, keras.metrics.Metric):
            found += list(leaf.variables)
    return found


def _optimizer_variables(optimizer: Any) -> list:
    if optimizer is None:
        return []
    found = list(getattr(optimizer, "variables", []))
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    return found + (_optimizer_variables(inner) if inner is not None else [])


def _cpu_devices_of_this_process(distribution: Any) -> int:
    """With several processes, how many CPU devices of the mesh this process holds (else 0)."""
    import jax

    if jax.process_count() == 1:
        return 0
    mine = [d for d in distribution.device_mesh.backend_mesh.devices.flat
            if d.process_index == jax.process_index()]
    return len(mine) if mine and mine[0].platform == "cpu" else 0


def _refuse_eager(model: Any, method: str, cpus: int) -> None:
    """Eager steps (one op at a time) on several processes of several CPU devices each never
    finish: JAX's CPU collectives (gloo) hang (measured, JAX 0.10.2: 2 processes of 2 CPU
    devices, `DataParallel` and `"hybrid"`, in fit or evaluate; plain JAX too)."""
    import jax

    if model.run_eagerly or not model.jit_compile:
        raise ValueError(
            f"{method}: jit_compile={model.jit_compile!r}, run_eagerly={model.run_eagerly!r} "
            f"cannot run on {jax.process_count()} JAX processes of {cpus} CPU devices each: "
            "each op then runs on its own, and JAX's CPU collectives (gloo) hang between "
            "such ops when a process has several devices (the step never finishes). Compile "
            "with jit_compile=True (JAX's default) and run_eagerly=False, or give each process "
            "one CPU device.")


def gather_predictions(model: Any, distribution: Any) -> None:
    """The per-instance patch `jax_predict_outputs_gathered`: `predict_step` whose outputs
    are replicated on every device, so every process reads the whole global batch's
    predictions (Keras concatenates them with numpy)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec())
    predict_step = model.predict_step

    def step(state: Any, data: Any) -> Any:
        outputs, rest = predict_step(state, data)
        return jax.tree.map(lambda t: jax.lax.with_sharding_constraint(t, replicated),
                            outputs), rest

    model.predict_step = step
    model.predict_function = None
