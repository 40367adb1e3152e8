"""`kmp.multi_gpu_model`: the successor of the removed `keras.utils.multi_gpu_model`.

The legacy recipe (template built under `tf.device('/cpu:0')`, `multi_gpu_model(model,
gpus=8)`, `compile`, `fit`, `model.save(...)`) runs with only its import changed.

Design. The returned model is an ordinary Keras model of the template's own class,
re-created from its config under a `MirroredStrategy` scope (`keras.models.clone_model`)
and given a copy of its weights: the two share no variable. Four public methods are
replaced on that one instance by thin wrappers around the class's own: `compile` enters
the strategy's scope; `fit` prepends a callback that copies the weights into the
template at each epoch end (before the user's callbacks run) and copies them again when
it returns (after `EarlyStopping` may have restored the best ones); `evaluate` copies
them after it runs; `fit`, `evaluate` and `predict` first take in weights loaded into
the template since the last copy (the legacy models shared their weights).
Rejected: a wrapper object is not a `keras.Model` (isinstance checks fail, attribute
assignments reach the wrong object); a dynamic subclass changes the class that is saved.
Replacing public methods on one instance leaves class, config and saving Keras's own.

Not covered: `train_on_batch` and the other `*_on_batch` methods do not update the
template; call `model.set_weights(parallel_model.get_weights())` after such a loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import keras

from keras_mgpu_plugins.backends.tensorflow import strategy as _strategy
from keras_mgpu_plugins.backends.tensorflow.local_devices import logical_devices
from keras_mgpu_plugins.backends.tensorflow.multi_gpu_link import (  # noqa: F401 - sync_action, weights_fingerprint
    TemplateLink,
    sync_action,
    weights_fingerprint,
)
from keras_mgpu_plugins.cluster.topology import topology


def multi_gpu_model(
    model: keras.Model,
    gpus: int | Sequence[int] | None = None,
    cpu_merge: bool = True,
    cpu_relocation: bool = False,
) -> keras.Model:
    """Replicates `model` on several devices: the legacy `multi_gpu_model`, on `MirroredStrategy`.

    Returns a new model, built under a `MirroredStrategy` over `gpus` devices,
    holding a copy of `model`'s weights. Compile and fit it as before (its
    `compile` enters the strategy's scope, and re-makes there an optimizer
    instance made outside): each global batch (`batch_size`) is split across
    the devices and the gradients are all-reduced. `model` (the template) receives the trained weights at
    each epoch end and when `fit`/`evaluate` return, so `model.save(...)` and
    `kmp.callbacks.ParallelModelCheckpoint(model, ...)` save the trained model.

    Without a GPU, logical CPU devices made by `kmp.simulate_devices(n)` are
    used, with a warning.

    Args:
        model: The template: a built `keras.Model` (Sequential, functional, or a
            subclass with `get_config()` that Keras can re-create).
        gpus: Number of devices (at least 2), or a list of GPU ids (e.g.
            `[0, 2]`); `None` uses every GPU.
        cpu_merge: No longer needed (outputs are not merged: gradients are
            all-reduced). Accepted for compatibility; `False` warns.
        cpu_relocation: No longer needed (each device holds a replica of the
            variables). Accepted for compatibility; `True` warns.

    Returns:
        A new `keras.Model` of `model`'s class, replicated on the devices.

    Raises:
        TypeError: If `model` is not a Keras 3 model, or cannot be re-created
            from its config.
        ValueError: If `gpus` is below 2 (`"gpus must be >= 2"`), asks for more
            devices than there are, or `model` is not built.
        StrategyError: In a multi-worker job (use `@kmp.parallelize` there).

    Example:
        >>> with tf.device("/cpu:0"):
        ...     model = build_model()
        >>> parallel_model = kmp.multi_gpu_model(model, gpus=2)
        >>> parallel_model.compile(loss="categorical_crossentropy", optimizer="rmsprop")
        >>> parallel_model.fit(x, y, epochs=20, batch_size=256)
        >>> model.save("my_model.keras")   # the template holds the trained weights
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "multi_gpu_model takes a Keras 3 model (keras.Model). Received: model="
            f"{model!r} of type {type(model).__module__}.{type(model).__name__}"
        )
    _warn_legacy_arguments(cpu_merge, cpu_relocation)
    if topology().is_multi_worker:
        raise _strategy.StrategyError(
            "multi_gpu_model replicates over this machine's devices only, but this process "
            "is one worker of a multi-worker job. Build the model in a @kmp.parallelize "
            "factory instead: it trains over every worker's devices."
        )
    gpu_devices, cpu_devices = logical_devices("GPU"), logical_devices("CPU")
    kind, ids = select_devices(gpus, len(gpu_devices), len(cpu_devices))
    names = [(gpu_devices if kind == "GPU" else cpu_devices)[i] for i in ids]
    if kind == "CPU":
        warnings.warn(
            f"No GPU found: multi_gpu_model replicates the model over {len(names)} logical "
            "CPU devices (kmp.simulate_devices). The multi-device code path runs, but not "
            "faster than on one device.",
            UserWarning,
            stacklevel=2,
        )
    strategy = _strategy.get_strategy("mirrored", names)
    parallel = _replicate(model, strategy)
    TemplateLink(model, parallel, strategy).install()
    return parallel


def select_devices(gpus: Any, num_gpus: int, num_cpus: int) -> tuple[str, list[int]]:
    """Which devices `multi_gpu_model(gpus=...)` replicates over.

    Args:
        gpus: The `gpus` argument: `None`, an integer, or a list of ids.
        num_gpus: Number of (logical) GPUs this process sees.
        num_cpus: Number of logical CPU devices, used when there is no GPU.

    Returns:
        `("GPU", ids)`, or `("CPU", ids)` when there is no GPU.

    Raises:
        ValueError: If `gpus` is malformed, below 2, or asks for more devices
            than there are.
    """
    kind, available = ("GPU", num_gpus) if num_gpus else ("CPU", num_cpus)
    ids = list(range(max(available, 2))) if gpus is None else _parse_gpus(gpus)
    if max(ids) < available:
        return kind, ids
    if isinstance(gpus, (list, tuple)):
        needs = f"device {max(ids)}"
    else:
        needs = f"{len(ids)} devices" if gpus is not None else "at least 2 devices"
    if kind == "GPU":
        seen = f"{available} GPU{'s' * (available != 1)} (ids 0 to {available - 1})"
    else:
        seen = (
            f"no GPU and {available} logical CPU device{'s' * (available != 1)}. To try it "
            "without GPUs, call kmp.simulate_devices(2) first thing in your script"
        )
    raise ValueError(
        f"multi_gpu_model(gpus={gpus!r}) needs {needs}, but this process sees {seen}. "
        f"Received: gpus={gpus!r}"
    )


def _parse_gpus(gpus: Any) -> list[int]:
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        ids = list(range(max(gpus, 0)))
    elif isinstance(gpus, (list, tuple)) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in gpus
    ):
        ids = list(gpus)
    else:
        raise ValueError(
            "gpus must be None (every GPU), an integer >= 2 or a list of GPU ids. "
            f"Received: gpus={gpus!r}"
        )
    if len(ids) < 2:
        raise ValueError(
            "For multi-device training, gpus must be >= 2 (on one device, train the model "
            f"itself). Received: gpus={gpus!r}"
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"gpus must not repeat an id. Received: gpus={gpus!r}")
    return ids


def _warn_legacy_arguments(cpu_merge: bool, cpu_relocation: bool) -> None:
    if not cpu_merge:
        warnings.warn(
            "cpu_merge=False has no effect: outputs are no longer merged on one device, "
            "MirroredStrategy all-reduces the gradients. The argument can be removed.",
            UserWarning,
            stacklevel=3,
        )
    if cpu_relocation:
        warnings.warn(
            "cpu_relocation=True has no effect: each device holds its own replica of the "
            "variables, and the template keeps its own copy. The argument can be removed.",
            UserWarning,
            stacklevel=3,
        )


def _replicate(model: keras.Model, strategy: Any) -> keras.Model:
    """A new model of `model`'s architecture under `strategy`, holding a copy of its weights."""
    if not model.built or not model.weights:
        raise ValueError(
            f"multi_gpu_model needs a built model (its weights created), but {model.name!r} "
            "has no weights yet. Start a Sequential model with keras.Input(shape), or build "
            "it by calling it on a batch of data (or model.build(input_shape)) first."
        )
    try:
        with strategy.scope():
            parallel = keras.models.clone_model(model)
    except (NotImplementedError, TypeError, ValueError) as err:
        raise TypeError(
            f"multi_gpu_model re-creates the model under MirroredStrategy from its config, "
            f"and {type(model).__name__} could not be re-created ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[0]}). Give the class a get_config() that returns "
            "its __init__ arguments, an __init__ that accepts **kwargs, and register it with "
            "@keras.saving.register_keras_serializable(); or build the model in a "
            "@kmp.parallelize factory instead."
        ) from err
    weights = model.get_weights()
    shapes = [tuple(w.shape) for w in parallel.get_weights()] if parallel.built else None
    if shapes != [tuple(w.shape) for w in weights]:
        raise TypeError(
            f"multi_gpu_model re-created {type(model).__name__} from its config, but the copy "
            f"does not have the template's weights (template: {len(weights)} arrays, copy: "
            f"{'not built' if shapes is None else len(shapes)}). Make get_config() return "
            "every argument that shapes the model, and give it a build config (build it "
            "with model.build(input_shape) or by calling it on data)."
        )
    parallel.set_weights(weights)
    return parallel
