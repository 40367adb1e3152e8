"""`kmp.placement_report(model)`: what each device holds and what crosses between them."""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_mgpu_plugins.model_parallel import costs as _costs
from keras_mgpu_plugins.model_parallel import plans
from keras_mgpu_plugins.model_parallel.balance import bubble_fraction


@dataclasses.dataclass(frozen=True)
class DeviceRow:
    """One device of a placed model.

    Attributes:
        device: Canonical device name, e.g. `/device:GPU:1`.
        layers: Its layer calls in execution order (`name#k`: k-th call of a shared layer).
            On JAX: the variables it holds, a shard as `path[rows, columns]`.
        parameter_bytes: Bytes of the variables it holds.
        optimizer_bytes: Bytes of the optimizer slots beside them (measured once the
            optimizer is built, estimated before).
        activation_bytes: Estimated bytes of its calls' outputs for one batch.
        transfer_bytes: Estimated bytes arriving from other devices per step (forward:
            the outputs of calls on other devices, and the variables of a shared layer
            called here but held on another device; the model's inputs not counted; the
            backward pass sends as many back).
    """

    device: str
    layers: tuple[str, ...]
    parameter_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    transfer_bytes: int


@dataclasses.dataclass(frozen=True)
class PlacementReport:
    """Where a model placed by `strategy="model_parallel"` (or `"hybrid"`) keeps what.

    Attributes:
        rows: One `DeviceRow` per device, in stage order.
        batch: The batch size activation and transfer estimates assume.
        micro_batches: Pieces per batch in `fit`.
        bubble_fraction: Expected idle share of a step, `(S - 1) / (M + S - 1)`.
        optimizer_measured: Whether optimizer bytes come from built slot variables.
        num_workers: Workers training data parallel, each holding this placement
            (`strategy="hybrid"`; 1 for `"model_parallel"`).
        worker_index: This worker's rank among them.
        layouts: On JAX, `(variable path, layout)` for each model variable: its mesh
            axes per dimension and why (sharded, replicated as small or as not
            dividing over the devices, or the `layout_map` key); under parameter
            servers, `(variable path, where its rows live)`; else empty.
        heading: The table's first line where the placement is not layer stages
            (parameter servers); `None`: the stages' line.
    """

    rows: tuple[DeviceRow, ...]
    batch: int
    micro_batches: int
    bubble_fraction: float
    optimizer_measured: bool
    num_workers: int = 1
    worker_index: int = 0
    layouts: tuple[tuple[str, str], ...] = ()
    heading: str | None = None

    def row(self, device: str) -> DeviceRow:
        """The row of `device` (canonical spelling, e.g. `/device:CPU:1`)."""
        for row in self.rows:
            if row.device == device:
                return row
        raise KeyError(f"{device!r} is not in this report: {[r.device for r in self.rows]}")

    def __str__(self) -> str:
        head = ("device", "layers", "params", "optimizer", "activations", "in from others")
        body = [(r.device, ", ".join(r.layers), _size(r.parameter_bytes),
                 _size(r.optimizer_bytes) + ("" if self.optimizer_measured else " (est.)"),
                 _size(r.activation_bytes), _size(r.transfer_bytes)) for r in self.rows]
        widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
        widths[1] = min(widths[1], 60)
        lines = [f"Placement ({len(self.rows)} stages, batch {self.batch}, micro_batches "
                 f"{self.micro_batches}, expected bubble {self.bubble_fraction:.0%})"]
        if self.layouts:  # JAX: every device runs every layer on its shards
            head = ("device", "variables", *head[2:])
            lines = [f"Sharded over {len(self.rows)} devices (batch {self.batch})"]
        if self.num_workers > 1:
            lines[0] = (f"Hybrid: {self.num_workers} workers (data parallel) x {len(self.rows)} "
                        f"devices each (model parallel); this is worker {self.worker_index}, "
                        "every worker holds the same placement\n" + lines[0])
        if self.heading is not None:  # parameter servers: variables held, no layer runs there
            head, lines = ("device", "variables", *head[2:4]), [self.heading]
            body, widths = [cells[:4] for cells in body], widths[:4]
        for cells in [head, *body]:
            lines.append("  ".join(_fit(str(c), w) for c, w in zip(cells, widths, strict=True)).rstrip())
        if self.layouts:
            lines.append("Layouts (mesh axis per dimension):" if self.heading is None
                         else "Variables (rows per parameter server):")
            lines.extend(f"  {path}  {layout}" for path, layout in self.layouts)
        return "\n".join(lines)


def _fit(text: str, width: int) -> str:
    return (text[: width - 3] + "...") if len(text) > width else text.ljust(width)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def placement_report(model: Any, batch_size: int | None = None) -> PlacementReport:
    """What each device of a placed model holds: layers, parameters, optimizer, activations.

    Args:
        model: A model returned by a factory decorated with
            `@kmp.parallelize(strategy="model_parallel")` or `strategy="hybrid"` (each
            worker reports its own devices; every worker holds the same placement). On
            JAX the rows list the variables (or shards) each device holds, bytes measured
            from the arrays' shards, and `layouts` the layout of every variable. With
            `strategy="parameter_server"`, one row per parameter server: the variables
            and shards (`path[first:last]` rows) it holds, and their optimizer slots.
        batch_size: Batch size for the activation and transfer estimates (default: the
            model input's fixed batch size, else 32).

    Returns:
        A `PlacementReport`; `str()` of it is a table, `.rows` its data.

    Raises:
        ValueError: If the model was not placed by `strategy="model_parallel"`.

    Example:
        >>> print(kmp.placement_report(model))
    """
    placed = plans.of(model)
    if placed is None:
        raise ValueError(
            "placement_report takes a model built by a factory decorated with "
            "@kmp.parallelize(strategy='model_parallel'), 'hybrid' or 'parameter_server'. "
            "Received: a model that was not placed."
        )
    if getattr(placed.plan, "sharded", False):  # JAX: variables sharded, not layers placed
        return placed.plan.report(model, batch_size)
    plan, canonical = placed.plan, placed.canonical
    est = _costs.Estimator(model)
    batch = batch_size or est.batch
    est.batch = batch
    per: dict[str, dict[str, Any]] = {
        d: {"layers": [], "params": 0, "act": 0, "transfer": 0, "opt": 0} for d in plan.devices}
    owner: dict[int, str] = {}
    produced_on: dict[int, str] = {}
    for call in plan.calls:
        row = per[call.device]
        row["layers"].append(call.label)
        if id(call.layer) not in owner:
            owner[id(call.layer)] = call.device
            for v in call.layer.weights:  # where the variable lives
                device = canonical(v.value.device) if v.value.device else call.device
                per.get(device, row)["params"] += est.parameter_bytes_of(v)
        row["act"] += est.activation_bytes(call.node)
        for v in call.layer.weights:  # a shared layer's variables, read from their device
            if v.value.device and canonical(v.value.device) != call.device:
                row["transfer"] += est.parameter_bytes_of(v)
        if call.node is not None:
            for t in call.node.outputs:
                produced_on[id(t)] = call.device
            for t in call.node.input_tensors:
                source = produced_on.get(id(t))
                if source is not None and source != call.device:
                    row["transfer"] += _costs.tensor_bytes(t, batch)
    optimizer = getattr(model, "optimizer", None)
    measured = bool(optimizer is not None and getattr(optimizer, "built", False))
    if measured:
        tracked = {id(v.value) for v in model.weights}
        for v in optimizer.variables:
            if id(v.value) in tracked or len(v.shape) == 0:
                continue
            device = canonical(v.value.device or plan.devices[0])
            if device in per:
                per[device]["opt"] += est.parameter_bytes_of(v)
    else:
        for row in per.values():
            row["opt"] = row["params"] * est.slots
    rows = tuple(DeviceRow(d, tuple(r["layers"]), r["params"], r["opt"], r["act"], r["transfer"])
                 for d, r in per.items())
    return PlacementReport(rows, batch, plan.micro_batches,
                           bubble_fraction(len(rows), plan.micro_batches), measured,
                           placed.workers, placed.worker_index)
