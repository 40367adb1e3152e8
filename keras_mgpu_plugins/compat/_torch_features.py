"""The changes the torch lane makes to Keras objects (`kind="feature"`), appended to
`compat._features.FEATURES`.

`torch_one_model_per_job` only refuses or arranges (it changes no number by itself);
the other three are kmp's data parallelism on a Keras whose `fit` has none (Keras 3.10
to 3.15: several processes would train separate models), and its input arrangement, and
change results: they fail closed outside the Keras versions they were checked on (a
pre-release such as keras-nightly included), unless `KMP_ALLOW_UNCHECKED_VERSIONS=1`.
"""

from __future__ import annotations

from keras_mgpu_plugins.compat._record import Patch, lazy

_MIN, _MAX = "3.10.0", "3.16.0"
_TRAINER = "https://github.com/keras-team/keras/blob/v3.15.1/keras/src/backend/torch/trainer.py"
_DDP = "https://github.com/keras-team/keras/pull/23316"
_KMP_MODELS = "kmp.parallelize on the torch backend in a job of several processes (its models)"
_AFTER_FIT = ("stall_watchdog_on_every_fit", "same_callbacks_on_every_worker",
              "chief_only_progress_bars")


def _has(path: str) -> bool:
    from keras_mgpu_plugins.compat._checks import resolve

    try:
        return callable(resolve(path))
    except AttributeError:
        return False


def _record(name: str, apply: str, symptom: str, wraps: tuple[str, ...], when: str,
            present: str, changes_results: bool = True, per_instance: bool = True,
            upstream: str = _TRAINER, after: tuple[str, ...] = ()) -> Patch:
    module, function = apply.rsplit(":", 1)
    return Patch(name=name, upstream=upstream, min_version=_MIN, max_version=_MAX,
                 apply=lazy(module, function), present=lambda: _has(present),
                 changes_results=changes_results, symptom=symptom, wraps=wraps, after=after,
                 kind="feature", when=when, per_instance=per_instance)


TORCH_FEATURES: tuple[Patch, ...] = (
    _record(
        "torch_one_model_per_job", "keras_mgpu_plugins.backends.torch.methods:wrap_methods",
        "torch, several processes (torchrun, kmp-launch, SLURM): each process silently trains "
        "its own model (Keras 3.15 and older: no DistributedDataParallel in fit), numpy inputs "
        "are not sharded (every process trains on every row), predict returns each process's "
        "own batches",
        tuple(f"keras.Model.{m}" for m in ("fit", "evaluate", "predict")),
        "the torch backend in a job of several processes (kmp.runtime.of, @kmp.parallelize, "
        "kmp-launch / torchrun workers)", "keras.Model.fit", changes_results=False,
        per_instance=False, upstream=_DDP,
        # (never both with the JAX or TensorFlow lane's records: one backend each)
        after=(*_AFTER_FIT, "jax_inputs_as_on_one_device", "same_calls_on_every_worker")),
    _record(
        "torch_steps_as_one_device", "keras_mgpu_plugins.backends.torch.steps:wrap_steps",
        "torch, several processes: logs are each process's own batches (History differs "
        "between processes), BatchNormalization's moving statistics drift apart, a batch with "
        "fewer rows than processes cannot be trained, predict is not gathered",
        tuple(f"keras.Model.{m}" for m in ("train_step", "test_step", "predict_step",
                                           "get_metrics_result")),
        _KMP_MODELS, "keras.Model.train_step",
        after=("placed_train_step", "jax_predict_outputs_gathered")),  # (other backends')
    _record(
        "torch_gradients_averaged", "keras_mgpu_plugins.backends.torch.gradients:wrap_optimizer",
        "torch, several processes: the processes' gradients are never averaged (Keras 3.15 and "
        "older), or averaged without weighting a last batch that splits unevenly (upstream "
        "DDP)", ("keras.optimizers.Optimizer.apply", "keras.optimizers.Optimizer.scale_loss"),
        _KMP_MODELS + " (each optimizer of the model, at fit)",
        "keras.optimizers.Optimizer.apply", upstream=_DDP),
    _record(
        "torch_sync_batchnorm", "keras_mgpu_plugins.backends.torch.batchnorm:wrap_moments",
        "torch: BatchNormalization(synchronized=True) raises 'Argument synchronized=True is "
        "only supported with the TensorFlow backend'; each process normalises with its own "
        "batch's statistics", ("keras.layers.BatchNormalization._moments",),
        "@kmp.parallelize(sync_batchnorm=True) on torch (every BatchNormalization layer)",
        "keras.layers.BatchNormalization._moments",
        upstream="https://github.com/keras-team/keras/blob/v3.15.1/keras/src/layers/"
                 "normalization/batch_normalization.py"),
)
