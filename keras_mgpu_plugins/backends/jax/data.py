"""Inputs as on one device, under `keras.distribution` on several JAX processes.

Users pass the same global arrays (numpy, or dicts/lists/tuples of them), the
global `batch_size` and `validation_data` to `fit`/`evaluate`/`predict` on every
process. With `P` processes, process `p` is fed rows `[p*b, (p+1)*b)` of every
global batch of `B = P*b` rows; Keras (`auto_shard_dataset=False`) assembles the
processes' shares into one global batch (`jax.make_array_from_process_local_data`),
the very batch one device trains on, so training equals one device. `predict`
returns every row once, in order, on every process.

A `keras.utils.PyDataset` or a generator, the same on every process, is fed the
same way: process `p` keeps its share of every batch it yields, the processes'
batches compared as they go (`backends.jax.streams`).

What cannot be split that way is refused with a clear error, never fed
differently: a batch (the last one included) that does not divide over the
devices, an input kmp cannot split by rows (a `tf.data.Dataset`, a torch
`DataLoader`). `shuffle=True` (fit's default) and `"batch"` shuffle the
global rows the same way on every process (`backends.jax.shuffle`).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np

from keras_mgpu_plugins.backends.jax import streams
from keras_mgpu_plugins.backends.jax.shuffle import share_rows  # noqa: F401 - and data.share_rows

_FIT_DEFAULT_BATCH = 32  # Keras's batch size when none is given (arrays)


def run_under(model: Any, distribution: Any) -> None:
    """Makes `model`'s fit/evaluate/predict run under `distribution`, fed as described above.

    Registered per-instance change `jax_inputs_as_on_one_device` (`kmp.compat`).
    """
    from keras_mgpu_plugins.compat import apply_to

    apply_to("jax_inputs_as_on_one_device", model, distribution)


def wrap_model(model: Any, distribution: Any) -> None:
    """Sets `fit`, `evaluate`, `predict` (and, with several processes, `predict_step`) on `model`."""
    import jax

    cpus = _cpu_devices_of_this_process(distribution)
    for name, arrays in (("fit", _fit_arguments), ("evaluate", _evaluate_arguments),
                         ("predict", _predict_arguments)):
        setattr(model, name, _wrapped(model, name, arrays, distribution, cpus))
    if jax.process_count() > 1:
        model.predict_step = _replicated_outputs(model.predict_step, distribution)
        model.predict_function = None


def _wrapped(model: Any, name: str, arrange: Any, distribution: Any, cpus: int) -> Any:
    method = getattr(model, name)
    signature = inspect.signature(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        if cpus > 1:
            _refuse_eager(model, name, cpus)
        if kwargs.get("_use_cached_eval_dataset"):  # fit's validation: already this process's
            with distribution.scope():
                return method(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items() if k != "kwargs"}
        with distribution.scope():
            arrange(arguments, _devices(distribution))
            return method(**arguments, **bound.arguments.get("kwargs", {}))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = method.__doc__
    return call


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


def _devices(distribution: Any) -> int:
    """How many pieces each global batch is split into: the mesh's batch axis (every device
    for `DataParallel`; `ModelParallel` shards the batch along its batch axis only)."""
    mesh = distribution.device_mesh
    return int(mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)])


def _fit_arguments(arguments: dict[str, Any], devices: int) -> None:
    import jax

    several = jax.process_count() > 1
    batch = arguments["batch_size"] or _FIT_DEFAULT_BATCH
    if several and streams.kind(arguments["x"]):
        arguments["x"] = streams.shared(arguments["x"], "fit(x=...)", devices,
                                        arguments["shuffle"])
        arguments["shuffle"] = False  # a PyDataset's batch order: permuted by kmp, shared
        _validation(arguments, batch, devices, several)
        return
    split = arguments["validation_split"]
    if several and split and arguments["validation_data"] is None:
        x, y, weights, arguments["validation_data"] = _split(
            arguments["x"], arguments["y"], arguments["sample_weight"], split)
        arguments.update(x=x, y=y, sample_weight=weights, validation_split=0.0)
    mode = arguments["shuffle"]
    shuffled = several and bool(mode)
    _arrays(arguments, ("x", "y", "sample_weight"), batch, devices, "fit", several,
            share=not shuffled)
    _validation(arguments, batch, devices, several)
    if shuffled:  # one permutation of the global rows per epoch, on every process
        from keras_mgpu_plugins.backends.jax.shuffle import shuffled_shares

        arrays = (arguments["x"], arguments["y"], arguments["sample_weight"])
        arguments.update(x=shuffled_shares(arrays, batch, mode), y=None, sample_weight=None,
                         shuffle=False, batch_size=None)
        return
    arguments["batch_size"] = batch // jax.process_count()


def _validation(arguments: dict[str, Any], batch: int, devices: int, several: bool) -> None:
    import jax

    data = arguments["validation_data"]
    if data is None:
        return
    vbatch = arguments["validation_batch_size"] or batch
    if several and streams.kind(data):
        arguments["validation_data"] = streams.shared(data, "fit(validation_data=...)", devices)
        return
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        if several:
            _refuse("validation_data", data)
        return
    names = ("x", "y", "sample_weight")[: len(data)]
    parts = dict(zip(names, data, strict=True))
    _arrays(parts, names, vbatch, devices, "validation_data", several)
    arguments["validation_data"] = tuple(parts[n] for n in names)
    arguments["validation_batch_size"] = vbatch // jax.process_count()


def _evaluate_arguments(arguments: dict[str, Any], devices: int) -> None:
    import jax

    if jax.process_count() > 1 and streams.kind(arguments["x"]):
        arguments["x"] = streams.shared(arguments["x"], "evaluate(x=...)", devices)
        return
    batch = arguments["batch_size"] or _FIT_DEFAULT_BATCH
    _arrays(arguments, ("x", "y", "sample_weight"), batch, devices, "evaluate",
            jax.process_count() > 1)
    arguments["batch_size"] = batch // jax.process_count()


def _predict_arguments(arguments: dict[str, Any], devices: int) -> None:
    import jax

    if jax.process_count() > 1 and streams.kind(arguments["x"]):
        arguments["x"] = streams.shared(arguments["x"], "predict(x=...)", devices)
        return
    batch = arguments["batch_size"] or _FIT_DEFAULT_BATCH
    _arrays(arguments, ("x",), batch, devices, "predict", jax.process_count() > 1)
    arguments["batch_size"] = batch // jax.process_count()


def _arrays(arguments: dict[str, Any], names: tuple[str, ...], batch: int, devices: int,
            method: str, several: bool, share: bool = True) -> None:
    """Checks that every global batch divides over `devices`; with `several` (and `share`),
    keeps this process's share of each (in place)."""
    import jax
    import keras

    leaves = {n: keras.tree.flatten(arguments[n]) for n in names if arguments.get(n) is not None}
    for name, values in leaves.items():
        for value in values:
            if not hasattr(value, "shape") or not getattr(value, "shape", ()):
                if not several:
                    return  # one process: Keras assembles the global batch itself
                _refuse(f"{method}({name}=...)", arguments[name])
    rows = {int(v.shape[0]) for values in leaves.values() for v in values}
    if not rows:
        return
    if len(rows) > 1:
        return  # Keras raises its own error for arrays of different lengths
    total = rows.pop()
    if batch % devices:
        raise ValueError(
            f"{method}: batch_size={batch} does not divide over the {devices} devices of the "
            "distribution (every global batch is split evenly over them). Pass a batch_size "
            f"that is a multiple of {devices}.")
    last = total % batch
    if last % devices:
        raise ValueError(
            f"{method}: the last batch of {last} rows ({total} rows, batch_size={batch}) does "
            f"not divide over the {devices} devices of the distribution. Pass a number of rows "
            f"or a batch_size such that the remainder is a multiple of {devices} (or 0), e.g. "
            f"drop the last {last % devices} rows.")
    if not several or not share:
        return
    index = share_rows(total, batch, jax.process_count(), jax.process_index())
    for name in leaves:
        arguments[name] = keras.tree.map_structure(lambda a: np.asarray(a)[index], arguments[name])


def _split(x: Any, y: Any, weights: Any, split: float) -> tuple:
    """Keras's `validation_split` on the global arrays: the last `split` of the rows."""
    import keras

    total = int(keras.tree.flatten(x)[0].shape[0])
    at = int(math.floor(total * (1.0 - split)))

    def cut(tree: Any, part: slice) -> Any:
        return None if tree is None else keras.tree.map_structure(
            lambda a: np.asarray(a)[part], tree)

    train = (cut(x, slice(0, at)), cut(y, slice(0, at)), cut(weights, slice(0, at)))
    held = tuple(t for t in (cut(x, slice(at, None)), cut(y, slice(at, None)),
                             cut(weights, slice(at, None))) if t is not None)
    return (*train, held)


def _refuse(what: str, value: Any) -> None:
    raise ValueError(
        f"{what}: an input of type {type(value).__name__} cannot be split into the processes' "
        "shares of each global batch by kmp on several JAX processes (every process would feed "
        "its own batches, not one device's). Pass numpy arrays (or dicts/lists of them), the "
        "same global arrays on every process, with the global batch_size; or the same "
        "keras.utils.PyDataset, generator or tf.data.Dataset on every process, yielding the "
        "global batches.")


def _replicated_outputs(predict_step: Any, distribution: Any) -> Any:
    """`predict_step` whose outputs are replicated on every device, so every process reads
    the whole global batch's predictions (Keras concatenates them with numpy)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec())

    def step(state: Any, data: Any) -> Any:
        outputs, rest = predict_step(state, data)
        return jax.tree.map(lambda t: jax.lax.with_sharding_constraint(t, replicated),
                            outputs), rest

    return step
