"""The changes kmp's own features make to Keras objects: `FEATURES`, applied where each is needed.

Unlike the workarounds (`compat._table`), these fix no upstream bug: each is a
kmp feature installed by wrapping a Keras method, at the moment named by
`when`, through `compat._registry.apply` (a class or module) or `apply_to` (one
object). They are registered so that one table says everything kmp changes,
in what order two wrappers of one method run, and `unpatch_keras()` undoes it
all. The functions they apply live beside the feature (`lazy` imports them at
the first use, so this table imports none of the feature modules).
"""

from __future__ import annotations

from keras_mgpu_plugins.compat._checks import CHECKED_BELOW
from keras_mgpu_plugins.compat._record import Patch, lazy

_MIN, _MAX = "3.10.0", CHECKED_BELOW["keras"]  # kmp's Keras floor (pyproject), the first unchecked
_FIT = "https://github.com/keras-team/keras/blob/v3.15.1/keras/src/backend/tensorflow/trainer.py"
_GRAPH = "https://github.com/keras-team/keras/blob/v3.15.1/keras/src/ops/function.py"
_MP = "a model_parallel / hybrid factory's build (kmp.parallelize)"


def _fit_takes(*names: str) -> bool:
    import inspect

    import keras

    return all(n in inspect.signature(keras.Model.fit).parameters for n in names)


def _graph_hook_there() -> bool:
    from keras_mgpu_plugins.compat._checks import check_model_parallel

    return not check_model_parallel()


def _has(path: str) -> bool:
    from keras_mgpu_plugins.compat._checks import resolve

    try:
        return callable(resolve(path))
    except AttributeError:
        return False


def _defines(module: str, name: str) -> bool:
    """Whether Keras's `module` defines `name` at its top level, read from its source (so a
    JAX module's code is checked without JAX installed)."""
    import importlib.util
    import pathlib
    import re

    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)  # the package alone: its submodules are not imported
    if spec is None or not spec.origin:
        return False
    path = pathlib.Path(spec.origin).parent.joinpath(*rest.split(".")).with_suffix(".py")
    if not path.is_file():
        return False
    return re.search(rf"^def {name}\(", path.read_text(encoding="utf-8"), re.M) is not None


def _feature(name: str, apply: str, symptom: str, wraps: tuple[str, ...], when: str,
             present: object, upstream: str = _FIT, after: tuple[str, ...] = (),
             per_instance: bool = False) -> Patch:
    module, function = apply.rsplit(":", 1)
    lane = module.split(".")[2] if module.startswith("keras_mgpu_plugins.backends.") else ""
    return Patch(name=name, upstream=upstream, min_version=_MIN, max_version=_MAX,
                 apply=lazy(module, function), present=present, changes_results=False,
                 symptom=symptom, wraps=wraps, after=after, kind="feature", when=when,
                 per_instance=per_instance, backend=lane)


_PS = "keras_mgpu_plugins.backends.tensorflow.patches.parameter_server"
_PS_WHEN = ("a ParameterServerStrategy created or given to kmp (kmp.parallelize(strategy="
            "'parameter_server'), or strategy=your_parameter_server_strategy)")

_SHARDED = "keras_mgpu_plugins.backends.tensorflow.patches.sharded"
_TF_CORE = "https://github.com/keras-team/keras/blob/v3.15.1/keras/src/backend/tensorflow/core.py"
_TF_OPT = ("https://github.com/keras-team/keras/blob/v3.15.1/keras/src/backend/tensorflow/"
           "optimizer.py")
#: The records of Keras variables split over parameter servers (`patches.sharded`).
_SHARDED_RECORDS = (
    ("partitioned_initialization", "patch_partitioned_initialization", "initializes_whole",
     "tensorflow variable._initialize_with_initializer", _TF_CORE,
     "parameter servers with variable_partitioner: the chief computes every partitioned "
     "variable whole (its memory) before TensorFlow splits it over the parameter servers"),
    ("sharded_embedding_lookup", "patch_embedding_lookup", "embedding_takes_whole_table",
     "keras.layers.Embedding.call",
     "https://github.com/keras-team/keras/blob/v3.15.1/keras/src/layers/core/embedding.py",
     "parameter servers: each step of an Embedding whose table is partitioned reads the whole "
     "table from the parameter servers into the worker"),
    ("sharded_gradient_sources", "patch_gradient_sources", "gradient_needs_one_handle",
     "tensorflow.GradientTape.gradient", _TF_CORE,
     "parameter servers with variable_partitioner: fit fails with AttributeError: "
     "'ShardedVariable' object has no attribute 'handle'"),
    ("sharded_optimizer_updates", "patch_sharded_updates", "updates_colocate",
     "tensorflow optimizer._distributed_tf_update_step", _TF_OPT,
     "parameter servers with variable_partitioner: fit fails with NotImplementedError: "
     "ShardedVariable doesn't support being used as a reference"),
    ("sharded_optimizer_slots", "patch_sharded_slots", "slots_colocate",
     "tensorflow optimizer.add_variable_from_reference", _TF_OPT,
     "parameter servers: Adam's moments of a partitioned variable are each one whole "
     "variable on one parameter server"),
)

FEATURES: tuple[Patch, ...] = (
    # The innermost of the wrappers of keras.Model.fit: it replaces Keras's own fit for a
    # parameter-server model; every other wrapper (the watchdog, the progress bars, ...) wraps it.
    _feature(
        "parameter_server_methods", f"{_PS}:wrap_methods",
        "model.fit / evaluate / predict under tf.distribute.experimental.ParameterServerStrategy "
        "fail: 'To use this dataset, you need to pass this dataset to ClusterCoordinator."
        "create_per_worker_dataset' (Keras 3 has no parameter-server fit)",
        tuple(f"keras.Model.{m}" for m in ("fit", "evaluate", "predict", "train_on_batch",
                                           "test_on_batch", "predict_on_batch")),
        _PS_WHEN, lambda: _fit_takes("steps_per_epoch", "validation_freq"),
        upstream="https://github.com/keras-team/keras/issues/18624"),
    *(_feature(name, f"{_SHARDED}:{apply}", symptom, (wraps,), _PS_WHEN, lazy(_SHARDED, present),
               upstream=upstream)
      for name, apply, present, wraps, upstream, symptom in _SHARDED_RECORDS),
    _feature(
        "chief_only_progress_bars", "keras_mgpu_plugins._worker_output:wrap_model_methods",
        "every worker of a multi-worker job prints the same progress bar (N interleaved copies "
        "in the kmp-launch terminal or the SLURM log)",
        ("keras.Model.fit", "keras.Model.evaluate", "keras.Model.predict"),
        "creating a strategy that spans workers (kmp.parallelize, kmp-launch; on JAX, once "
        "kmp finds or starts jax.distributed over several processes)",
        lambda: _fit_takes("verbose"), after=("parameter_server_methods",)),
    # Inside the same-callbacks check: that check compares the callbacks each worker was
    # given, not the watchdog the launcher adds to every worker's fit alike.
    _feature(
        "stall_watchdog_on_every_fit",
        "keras_mgpu_plugins.callbacks.stall_watchdog:wrap_every_fit",
        "a multi-worker job in which one worker hangs waits forever, silently: no worker "
        "named, no stacks", ("keras.Model.fit",),
        "in kmp-launch / kmp.launch workers, once Keras is imported (unless --stall-timeout 0 "
        "/ stall_timeout=None)",
        lambda: _fit_takes("callbacks"), after=("chief_only_progress_bars",)),
    _feature(
        "same_callbacks_on_every_worker", "keras_mgpu_plugins._same_callbacks:wrap_fit",
        "a multi-worker job hangs (or fails with an unclear collective error) when workers are "
        "given different kmp callbacks, or inputs with different numbers of steps; Keras's "
        "CSVLogger, TensorBoard, ModelCheckpoint and BackupAndRestore write the same path from "
        "every worker (kmp: CSVLogger and TensorBoard on the chief only, Keras's ModelCheckpoint "
        "and BackupAndRestore refused on every worker before training)",
        ("keras.Model.fit",), "creating a strategy that spans workers (kmp.parallelize, "
        "kmp-launch; on JAX, once kmp finds or starts jax.distributed over several processes)", lambda: _fit_takes("callbacks"), after=("stall_watchdog_on_every_fit",)),
    _feature(
        "placed_model_clone_warning", "keras_mgpu_plugins.backends.tensorflow.model_parallel.factory:wrap_clone_model",
        "keras.models.clone_model of a model_parallel / hybrid model silently returns a model "
        "that runs on one device", ("keras.models.clone_model",), _MP,
        lambda: _has("keras.models.clone_model"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/models/cloning.py"),
    _feature(
        "placement_records_layer_calls", "keras_mgpu_plugins.backends.tensorflow.model_parallel.placement:wrap_layer_call",
        "model_parallel: the tf.device / keras.device scopes around layer calls in the factory "
        "are lost in fit (every layer runs on one device)", ("keras.layers.Layer.__call__",),
        "while a model_parallel / hybrid factory runs (undone when it returns)",
        _graph_hook_there, upstream=_GRAPH),
    _feature(
        "placed_graph_run", "keras_mgpu_plugins.backends.tensorflow.patches.functional_graph:set_graph_run",
        "model_parallel: fit runs every layer on one device although the factory placed them",
        ("functional graph._run_through_graph",), _MP, _graph_hook_there,
        upstream=_GRAPH, per_instance=True),
    _feature(
        "placed_layer_call", "keras_mgpu_plugins.backends.tensorflow.model_parallel.placement:wrap_in_device",
        "model_parallel, subclassed model: its layers run where TensorFlow puts them (one device)",
        ("keras.layers.Layer.call", "keras.layers.Layer.build"), _MP,
        lambda: _has("keras.layers.Layer.build"), per_instance=True),
    _feature(
        "placed_train_step", "keras_mgpu_plugins.backends.tensorflow.model_parallel.pipeline:set_train_step",
        "model_parallel: gradients computed on one device; micro_batches has no effect",
        ("keras.Model.train_step",), _MP, lambda: _has("keras.Model.train_step"),
        per_instance=True),
    _feature(
        "placed_compile_keeps_placement",
        "keras_mgpu_plugins.backends.tensorflow.model_parallel.factory:wrap_compile",
        "model_parallel: after compiling again, the optimizer's slots (Adam's moments) are all "
        "on one device, and jit_compile puts the whole model on one device",
        ("keras.Model.compile",), _MP, lambda: _has("keras.Model.compile"), per_instance=True),
    _feature(
        "hybrid_compile_in_strategy_scope",
        "keras_mgpu_plugins.backends.tensorflow.model_parallel.hybrid:wrap_compile",
        "hybrid: a model compiled again outside the strategy's scope gets an optimizer "
        "outside the strategy", ("keras.Model.compile",), _MP,
        lambda: _has("keras.Model.compile"), after=("placed_compile_keeps_placement",),
        per_instance=True),
    _feature(
        "overridden_compile_adopts_its_arguments",
        "keras_mgpu_plugins.backends.tensorflow.patches.outside_scope:wrap_compile",
        "a model whose class overrides compile and keeps optimizers itself (a GAN's "
        "compile(d_optimizer, g_optimizer, loss_fn)), compiled with optimizers made outside "
        "the strategy's scope: 'Mixing different tf.distribute.Strategy objects' in fit, or "
        "iterations counting every replica's step", ("keras.Model.compile",),
        "kmp.parallelize on TensorFlow under a strategy spanning replicas or workers, for a "
        "model whose class overrides compile", lambda: _has("keras.Model.compile"),
        upstream="https://github.com/keras-team/keras/issues/17187",
        after=("hybrid_compile_in_strategy_scope",), per_instance=True),
    _feature(
        "placed_optimizer_slots", "keras_mgpu_plugins.backends.tensorflow.model_parallel.factory:wrap_slot_creation",
        "model_parallel: the optimizer's slot variables are all created on one device (out of "
        "memory on the first GPU)", ("keras.optimizers.Optimizer.add_variable_from_reference",),
        _MP, lambda: _has("keras.optimizers.Optimizer.add_variable_from_reference"),
        per_instance=True),
    _feature(
        "placement_report_on_first_fit",
        "keras_mgpu_plugins.backends.tensorflow.model_parallel.factory:wrap_fit_with_report",
        "model_parallel: no table of which layers run on which device before the first fit",
        ("keras.Model.fit",), _MP, lambda: _fit_takes("batch_size", "verbose"),
        per_instance=True),
    _feature(
        "multi_gpu_parallel_methods",
        "keras_mgpu_plugins.backends.tensorflow.multi_gpu_link:forward_parallel_methods",
        "kmp.multi_gpu_model: compile/fit of the parallel model leave the template's weights "
        "stale, or create the optimizer outside the strategy",
        tuple(f"multi_gpu_model's parallel keras.Model.{m}"
              for m in ("compile", "fit", "evaluate", "predict")),
        "kmp.multi_gpu_model(model)", lambda: _fit_takes("callbacks"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/trainer.py",
        per_instance=True),
    _feature(
        "multi_gpu_template_watch", "keras_mgpu_plugins.backends.tensorflow.multi_gpu_link:watch_template",
        "kmp.multi_gpu_model: weights set or loaded on the template model are not seen by the "
        "parallel model", ("multi_gpu_model's template keras.Model.set_weights",
                           "multi_gpu_model's template keras.Model.load_weights"),
        "kmp.multi_gpu_model(model)", lambda: _has("keras.Model.load_weights"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/models/model.py",
        per_instance=True),
    _feature(
        "jax_inputs_as_on_one_device", "keras_mgpu_plugins.backends.jax.methods:wrap_methods",
        "JAX, several processes: fit/evaluate/predict refuse numpy inputs (auto_shard_dataset), "
        "or with auto_shard_dataset=False each process's whole batch is a shard (P times the "
        "batch); a model used outside the factory trains without its distribution; a model "
        "class that overrides fit (keras-hub's tasks) fails with KeyError: 'shuffle'; "
        "model.save / keras.models.load_model on one process waits forever (a distribution "
        "left set for the whole process); jit_compile=False on processes of several CPU "
        "devices each hangs (gloo)",
        tuple(f"keras.Model.{m}" for m in ("fit", "evaluate", "predict", "train_on_batch",
                                           "test_on_batch", "predict_on_batch")),
        "kmp.parallelize on the JAX backend (every model it builds; other models untouched)",
        lambda: _fit_takes("batch_size", "shuffle", "validation_batch_size"),
        upstream="https://github.com/keras-team/keras/issues/18560",
        after=("stall_watchdog_on_every_fit", "same_callbacks_on_every_worker",
               "chief_only_progress_bars")),
    # Outside every other wrapper of these methods: the workers meet before any collective of
    # the call (the same-callbacks all-gather included). Never applied with the JAX lane's
    # record (its methods meet themselves); the order between the two is only declared.
    _feature(
        "same_calls_on_every_worker", "keras_mgpu_plugins.backends.tensorflow.same_calls:wrap_methods",
        "TensorFlow, several workers: fit/evaluate/predict made on one worker only (the chief "
        "evaluating alone) fails 12 to 20 s later with 'UnavailableError: Collective ops is "
        "aborted by: ... tasks are unhealthy' once the other workers end; while they call "
        "something else, with 'Collective instance N expected type ...', or it hangs", ("keras.Model.fit", "keras.Model.evaluate", "keras.Model.predict"),
        "creating a strategy that spans workers on TensorFlow (kmp.parallelize, kmp-launch, a "
        "MultiWorkerMirroredStrategy given to kmp)", lambda: _fit_takes("callbacks"),
        after=("same_callbacks_on_every_worker", "jax_inputs_as_on_one_device")),
    _feature(
        "jax_compile_under_model_distribution",
        "keras_mgpu_plugins.backends.jax.methods:wrap_compile",
        "JAX: compiling a model kmp built again outside the factory (fine-tuning) fails in fit "
        "with 'Received incompatible devices for jitted computation' (an optimizer made "
        "outside the model's distribution)", ("base trainer.compile",),
        "kmp.parallelize on the JAX backend (every model it builds; other models untouched)",
        lambda: _has("base trainer.compile"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/trainers/"
                 "trainer.py", after=("compile_adopts_state_made_outside",)),
    _feature(
        "jax_predict_outputs_gathered", "keras_mgpu_plugins.backends.jax.methods:gather_predictions",
        "JAX, several processes: predict raises 'Fetching value for jax.Array that spans "
        "non-addressable devices'", ("keras.Model.predict_step",),
        "kmp.parallelize on the JAX backend with several processes (the factory's model)",
        lambda: _has("keras.Model.predict_step"),
        upstream="https://github.com/keras-team/keras/issues/18560", per_instance=True),
    _feature(
        "jax_partial_batches_replicated",
        "keras_mgpu_plugins.backends.jax.batches:patch_distribute_data",
        "JAX: a last batch (or a batch_size) whose rows do not divide over the devices fails "
        "inside JAX (make_array_from_process_local_data: 'not evenly divisible') or is refused; "
        "predict(x_test) on an odd number of rows fails",
        ("jax trainer module._distribute_data",),
        "kmp.parallelize on the JAX backend (the first model it builds)",
        lambda: _defines("keras.src.backend.jax.trainer", "_distribute_data"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/backend/jax/"
                 "trainer.py"),
    _feature(
        "progbar_hidden_keys", "keras_mgpu_plugins.compat._private:wrap_history_epoch_end",
        "DeviceMetricsLogger(progbar='summary'): the progress bar still shows every per-device "
        "key", ("keras.callbacks.History.on_epoch_end",),
        "DeviceMetricsLogger(progbar='summary') at train begin", lambda: _has(
            "keras.callbacks.History.on_epoch_end"),
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/callbacks/"
                 "callback_list.py", per_instance=True),
)

from keras_mgpu_plugins.compat._resume_features import RESUME_FEATURES  # noqa: E402
from keras_mgpu_plugins.compat._torch_features import TORCH_FEATURES  # noqa: E402
from keras_mgpu_plugins.compat._verify_features import (  # noqa: E402
    RANDOM_FEATURES,
    VERIFY_FEATURES,
)

FEATURES += TORCH_FEATURES + VERIFY_FEATURES + RANDOM_FEATURES + RESUME_FEATURES
