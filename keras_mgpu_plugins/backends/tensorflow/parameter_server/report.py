"""`kmp.placement_report(model)` of a parameter-server model: what each parameter server holds.

One row per parameter server: the variables (or shards, `path[first:last]` rows) it
holds, their bytes, and the optimizer's slots beside them. `layouts` says, per variable,
on which parameter servers its rows live. Activations live on the workers, which hold
no variable: their columns are 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_mgpu_plugins.model_parallel import plans
from keras_mgpu_plugins.model_parallel.report import DeviceRow, PlacementReport


@dataclasses.dataclass
class ParameterServerPlan:
    """The placement of a parameter-server model (`model_parallel.plans`)."""

    num_ps: int
    micro_batches: int = 1
    sharded = True  # placement_report asks the plan for its report

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(_ps_device(i) for i in range(self.num_ps))

    def report(self, model: Any, batch_size: int | None) -> PlacementReport:
        return _report(self, model, batch_size)


def record(model: Any, num_ps: int) -> None:
    """Notes that `model`'s variables live on `num_ps` parameter servers."""
    plans.record(model, plans.Placed(ParameterServerPlan(num_ps), lambda name: name))


def _ps_device(index: int) -> str:
    return f"/job:ps/replica:0/task:{index}/device:CPU:0"


def pieces(variable: Any) -> list[tuple[str, int, int, int]]:
    """`(device, first row, last row + 1, bytes)` of each piece of a Keras variable."""
    from keras_mgpu_plugins.backends.tensorflow.patches.sharded import is_sharded

    value = variable.value
    parts = value.variables if is_sharded(value) else [value]
    found, row = [], 0
    for part in parts:
        rows = int(part.shape[0]) if part.shape.rank else 1
        found.append((_canonical(part.device), row, row + rows,
                      int(part.shape.num_elements()) * part.dtype.size))
        row += rows
    return found


def _canonical(device: str) -> str:
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(device_type=spec.device_type or "CPU",
                        device_index=spec.device_index or 0).to_string()


def _report(plan: ParameterServerPlan, model: Any, batch_size: int | None) -> PlacementReport:
    per = {d: {"vars": [], "params": 0, "opt": 0} for d in plan.devices}
    layouts = []
    for variable in model.weights:
        held = pieces(variable)
        for device, first, last, size in held:
            label = variable.path if len(held) == 1 else f"{variable.path}[{first}:{last}]"
            per.setdefault(device, {"vars": [], "params": 0, "opt": 0})
            per[device]["vars"].append(label)
            per[device]["params"] += size
        layouts.append((variable.path, ", ".join(
            f"rows {first}:{last} on {_short(device)}" for device, first, last, _ in held)
            if len(held) > 1 else f"whole on {_short(held[0][0])}"))
    optimizer = getattr(model, "optimizer", None)
    measured = bool(optimizer is not None and getattr(optimizer, "built", False))
    if measured:
        tracked = {id(v) for v in model.weights}
        for variable in optimizer.variables:
            if id(variable) not in tracked and len(variable.shape):
                for device, _, _, size in pieces(variable):
                    per.setdefault(device, {"vars": [], "params": 0, "opt": 0})["opt"] += size
    rows = tuple(DeviceRow(d, tuple(r["vars"]), r["params"], r["opt"], 0, 0)
                 for d, r in per.items())
    shards = sum(len(pieces(v)) > 1 for v in model.weights)
    heading = (f"Parameter servers: {plan.num_ps}; {shards} variable(s) split over them, the "
               "others whole (round-robin); the workers hold no variable")
    return PlacementReport(rows, batch_size or 0, 1, 0.0, measured, layouts=tuple(layouts),
                           heading=heading)


def _short(device: str) -> str:
    """`ps 1` for `/job:ps/replica:0/task:1/device:CPU:0`."""
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.job} {spec.task}" if spec.job else device
