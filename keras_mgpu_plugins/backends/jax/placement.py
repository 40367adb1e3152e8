"""`kmp.placement_report` of a model sharded by `strategy="model_parallel"` / `"hybrid"` on JAX.

Bytes are measured: each variable's `addressable_shards` (the pieces this process's devices
hold), for the model's variables and, once the optimizer is built, its slots (before: the
parameters' bytes times the optimizer's slots per parameter, marked estimated).
Activation and transfer bytes are estimates: a layer whose variables are sharded along
their last axis keeps `1/n` of its output on each device, and its output is gathered
(`(n - 1)/n` of it arriving on each device) for the next layer; other outputs are whole
on every device.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from keras_mgpu_plugins.model_parallel import costs as _costs
from keras_mgpu_plugins.model_parallel import plans
from keras_mgpu_plugins.model_parallel.report import DeviceRow, PlacementReport


def device_name(device: Any) -> str:
    """Keras's spelling of a JAX device, e.g. `"cpu:1"` (what `devices=` takes)."""
    return f"{device.platform}:{device.id}"


@dataclasses.dataclass
class ShardedPlan:
    """What `KmpModelParallel` chose for one model (see `backends.jax.model_parallel`).

    Attributes:
        distribution: The model's `KmpModelParallel` (its `.decisions` by variable path).
        devices: This process's devices of the mesh, in mesh order (Keras's spelling).
        micro_batches: Always 1 (no pipeline on JAX).
    """

    distribution: Any
    devices: tuple[str, ...]
    micro_batches: int = 1
    sharded = True

    def report(self, model: Any, batch_size: int | None) -> PlacementReport:
        return _report(self, model, batch_size)


def record(model: Any, distribution: Any) -> None:
    """Notes `model`'s layouts for `kmp.placement_report` (`model_parallel.plans`)."""
    import jax

    mine = jax.process_index()
    devices = tuple(device_name(d) for d in distribution.device_mesh.backend_mesh.devices.flat
                    if d.process_index == mine)
    mesh = distribution.device_mesh
    workers = int(mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)])
    plans.record(model, plans.Placed(ShardedPlan(distribution, devices), str.lower,
                                     workers=workers, worker_index=mine if workers > 1 else 0))


def _held(variable: Any) -> dict[str, tuple[int, str]]:
    """Per device of this process: the bytes of `variable` it holds and which part."""
    value = variable.value
    found = {}
    for shard in value.addressable_shards:
        part = ", ".join(_slice(s, n) for s, n in zip(shard.index, value.shape, strict=True))
        label = variable.path if value.is_fully_replicated or not value.shape else (
            f"{variable.path}[{part}]")
        found[device_name(shard.device)] = (int(shard.data.nbytes), label)
    return found


def _slice(piece: slice, size: int) -> str:
    start, stop = piece.start or 0, size if piece.stop is None else piece.stop
    return ":" if (start, stop) == (0, size) else f"{start}:{stop}"


def _report(plan: ShardedPlan, model: Any, batch_size: int | None) -> PlacementReport:
    est = _costs.Estimator(model)
    batch = batch_size or est.batch
    per = {d: {"vars": [], "params": 0, "opt": 0} for d in plan.devices}
    for variable in model.weights:
        for device, (size, label) in _held(variable).items():
            if device in per:
                per[device]["vars"].append(label)
                per[device]["params"] += size
    optimizer = getattr(model, "optimizer", None)
    measured = bool(optimizer is not None and getattr(optimizer, "built", False))
    if measured:
        tracked = {id(v) for v in model.weights}
        for variable in optimizer.variables:
            if id(variable) in tracked or len(variable.shape) == 0:
                continue
            for device, (size, _) in _held(variable).items():
                if device in per:
                    per[device]["opt"] += size
    else:
        for variable in getattr(model, "trainable_weights", []):
            for device, (size, _) in _held(variable).items():
                if device in per:
                    per[device]["opt"] += size * est.slots
    activations, transfers = _activations(plan, model, batch)
    rows = tuple(DeviceRow(d, tuple(r["vars"]), r["params"], r["opt"], activations, transfers)
                 for d, r in per.items())
    large = dict(large_replicated(model, plan.distribution))
    note = (f" - LARGE (>= {LARGE_SHARE:.0%} of the parameters, >= {LARGE_BYTES:,} bytes), held "
            "whole by every device")
    layouts = tuple((path, _describe(axes, why) + (note if path in large else ""))
                    for path, (axes, why) in plan.distribution.decisions.items()
                    if path in {v.path for v in model.weights})
    placed = plans.of(model)
    return PlacementReport(rows, batch, 1, 0.0, measured, placed.workers, placed.worker_index,
                           layouts=layouts)


def _describe(axes: tuple[Any, ...], why: str) -> str:
    spec = "(" + ", ".join("None" if a is None else repr(a) for a in axes) + ")"
    return f"{spec}: {why}"


def _activations(plan: ShardedPlan, model: Any, batch: int) -> tuple[int, int]:
    """Estimated activation bytes each device keeps, and bytes arriving from the others."""
    n = len(plan.devices)
    decisions = plan.distribution.decisions
    kept = arriving = 0
    for layer in getattr(model, "layers", []):
        try:
            outputs = layer.output
        except (AttributeError, ValueError):  # never called, or called several times
            continue
        size = sum(_costs.tensor_bytes(t, batch) for t in _flat(outputs))
        sharded = [decisions.get(v.path, ((),))[0] for v in layer.weights]
        if any(axes and axes[-1] is not None for axes in sharded):
            kept += size // n
            arriving += size * (n - 1) // n
        elif any(axes and any(a is not None for a in axes) for axes in sharded):
            kept += size  # rows sharded (an embedding): partial outputs summed over devices
            arriving += size * (n - 1) // n
        else:
            kept += size
    return kept, arriving


def _flat(outputs: Any) -> list[Any]:
    import keras

    return list(keras.tree.flatten(outputs))


#: A variable the user's map leaves replicated is "large" from this share of the parameters
#: and this many bytes (below, its copies on every device cost little).
LARGE_SHARE = 0.1
LARGE_BYTES = 1 << 20


def large_replicated(model: Any, dist: Any) -> list[tuple[str, int]]:
    """The variables no key of the user's map matched that hold at least `LARGE_SHARE` of the
    model's parameter bytes (and `LARGE_BYTES`), with their bytes, largest first."""
    sizes = {v.path: int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights}
    total = sum(sizes.values())
    unmatched = [path for path, (_, why) in dist.decisions.items()
                 if why.startswith("replicated (no layout_map") and path in sizes]
    return sorted(((p, sizes[p]) for p in unmatched
                   if len(sizes) > 1 and sizes[p] >= max(LARGE_SHARE * total, LARGE_BYTES)),
                  key=lambda i: -i[1])
