"""The steps of a model kmp trains on several torch processes: as one device's on the global batch.

The per-instance patch `torch_steps_as_one_device` wraps the model's `train_step`,
`test_step`, `predict_step` (its class's: Keras's, or the user's own) and
`get_metrics_result`:

- each step takes what kmp fed (`feeding.take`) and sets the `Step` that the gradient
  averaging (`gradients`) and synchronised BatchNormalization (`batchnorm`) read: this
  process's weight in the step (`n_p / n`; `1 / P` for a batch fed whole);
- the first step of each top-level call gives every process rank 0's variables (the
  initial weights, and the optimizer's state: as DDP does when it wraps a model);
- after each step, one all-reduce gives every process the global batch's logs (where they
  are read: a progress bar, a callback's batch hook, a train_step of the user's; else only
  the epoch's, by `get_metrics_result`, and a step runs no collective of its own): the sum of
  the processes' metric states (Keras's metrics are sums: totals, counts, confusion
  matrices), read through a `keras.StatelessScope` (the states themselves stay this
  process's), any other scalar log averaged by weight, and, in training, rank 0's value
  of the non-trainable variables the step wrote (BatchNormalization's moving statistics,
  as DDP broadcasts its buffers), so the processes' weights stay identical. A batch fed
  whole to every process counts in rank 0's metrics only;
- `predict_step` gathers every process's rows, in order, on every process.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
from typing import Any

from keras_mgpu_plugins.backends.torch import collectives, feeding, models
from keras_mgpu_plugins.inputs import packed


class Step:
    """The step in progress: this process's weight in it, and how its gradients travel."""

    def __init__(self, info: feeding.StepInfo | None, processes: int) -> None:
        self.info, self.processes = info, processes
        if info is None or info.whole:
            self.weight = 1.0 / processes
        else:
            self.weight = info.rows / info.count
        self.whole = info is not None and info.whole
        self.ddp_forward = False  # upstream's DistributedDataParallel ran this step's forward
        self.loss_weighted = False  # scale_loss weighted this process's loss (`gradients`)


_HOOKED = "_kmp_forward_marked"
_current: list[Step] = []
_local_results: list[bool] = []


def current() -> Step | None:
    """The step in progress in this process (`None` outside kmp's steps)."""
    return _current[-1] if _current else None


@contextlib.contextmanager
def _in_step(step: Step) -> Any:
    _current.append(step)
    _local_results.append(True)
    try:
        yield step
    finally:
        _current.pop()
        _local_results.pop()


def wrap_steps(model: Any) -> None:
    """The patch: sets the four wrappers on `model` (its class's methods inside)."""
    train, test, predict = model.train_step, model.test_step, model.predict_step
    model.train_step = functools.wraps(train)(functools.partial(_train, model, train))
    model.test_step = functools.wraps(test)(functools.partial(_test, model, test))
    model.predict_step = functools.wraps(predict)(functools.partial(_predict, model, predict))
    model.get_metrics_result = functools.partial(_metrics_result, model)


def _begin(model: Any, data: Any) -> tuple[Any, Step]:
    """The step's `Step`; rank 0's state first where due. `data` must be unpacked already."""
    found = models.arranged(model)
    step = Step(feeding.take(found, data), collectives.world()[1])
    if found is not None and found.pending_broadcast:
        found.pending_broadcast = False
        from keras_mgpu_plugins.backends.torch import parallel

        parallel.broadcast_state(model)
    return found, step


def _train(model: Any, original: Any, data: Any) -> Any:
    data = packed.unpack(data)  # a batch of more than 3 parts, as the input yielded it
    found, step = _begin(model, data)
    from keras_mgpu_plugins.backends.torch import buffers

    watch_upstream_ddp(model)
    before = buffers.versions(model) if found is not None and found.buffers is None else None
    logs = _counted_once(model, step, original, data)
    if before is not None:
        found.buffers = buffers.written(model, before)
    if found is not None and not found.step_logs and not found.buffers:
        return logs  # nobody reads them: the epoch's logs are reduced (get_metrics_result)
    return global_logs(model, logs, step, found.buffers if found is not None else [])


def _test(model: Any, original: Any, data: Any) -> Any:
    data = packed.unpack(data)
    _, step = _begin(model, data)
    return global_logs(model, _counted_once(model, step, original, data), step, [])


def _counted_once(model: Any, step: Step, original: Any, data: Any) -> Any:
    """Runs the step; on a batch fed whole, only rank 0's metrics count it."""
    keep = step.whole and collectives.world()[0] != 0
    saved = [v.value.detach().clone() for v in model.metrics_variables] if keep else None
    with _in_step(step):
        logs = original(data)
    if saved is not None:
        for variable, value in zip(model.metrics_variables, saved, strict=True):
            variable.assign(value)
    return logs


def _predict(model: Any, original: Any, data: Any) -> Any:
    import keras

    data = packed.unpack(data)
    _, step = _begin(model, data)
    with _in_step(step):
        outputs = original(data)
    if step.info is None or step.whole or step.processes == 1:
        return outputs  # a batch fed whole (or not by kmp): this process's outputs are all
    leaves = keras.tree.flatten(outputs)
    gathered = collectives.gather_rows(leaves, step.info.rows)
    return keras.tree.pack_sequence_as(outputs, gathered)


def _metrics_result(model: Any) -> dict:
    """This process's results inside a step (the step reduces once, after); the global
    batches' everywhere else (one all-reduce: every process calls it at the same points)."""
    if _local_results and _local_results[-1]:
        return local_results(model)
    return global_logs(model, {}, None, [])


def local_results(model: Any) -> dict:
    """`Model.get_metrics_result` of Keras's base trainer: each metric's result, as floats."""
    found: dict[str, Any] = {}
    for metric in model.metrics:
        result = metric.result()
        if isinstance(result, dict):
            found.update(result)
        else:
            found[metric.name] = result
    return _pythonify(found)


def global_logs(model: Any, logs: Any, step: Step | None, written: list) -> Any:
    """`logs` of every process's part of the global batch (see the module docstring)."""
    import keras
    import torch

    if collectives.world()[1] == 1:
        return logs if logs else local_results(model)
    metric_vars = list(model.metrics_variables)
    names = set(local_results(model)) if logs else set()
    extra = {k: v for k, v in (logs or {}).items() if k not in names and _scalar(v)}
    weight = step.weight if step is not None else 1.0 / collectives.world()[1]
    chief = 1.0 if collectives.world()[0] == 0 else 0.0
    parts = ([v.value.detach().reshape(-1) for v in metric_vars]
             + [v.value.detach().reshape(-1) * chief for v in written]
             + [torch.as_tensor([float(v) for v in extra.values()]) * weight])
    wire = torch.cat([p.to(collectives.device(), torch.float64) for p in parts])
    collectives.all_reduce_(wire)
    offset, reduced = 0, []
    for variable in metric_vars + written:
        n = variable.value.numel()
        value = wire[offset:offset + n].reshape(variable.value.shape)
        reduced.append(value.to(variable.value.device, variable.value.dtype))
        offset += n
    for variable, value in zip(written, reduced[len(metric_vars):], strict=True):
        variable.assign(value)
    with keras.StatelessScope(state_mapping=list(zip(metric_vars, reduced, strict=False))):
        results = local_results(model)
    averaged = dict(zip(extra, wire[offset:].cpu().tolist(), strict=True))
    if not logs:
        return results

    def chosen(key: str, value: Any) -> Any:
        if isinstance(value, dict):  # a metric whose result is a dict (compile_metrics)
            return {k: chosen(k, v) for k, v in value.items()}
        return results.get(key, averaged.get(key, value))

    return {k: chosen(k, v) for k, v in logs.items()}


def _scalar(value: Any) -> bool:
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        return True
    return getattr(value, "shape", None) in ((), [])


def _pythonify(logs: dict) -> dict:
    out: dict[str, Any] = {}
    for key, value in sorted(logs.items()):
        if isinstance(value, dict):
            out.update(_pythonify(value))
            continue
        try:
            value = float(value)
        except (TypeError, ValueError):
            pass
        out[key] = value
    return out


def watch_upstream_ddp(model: Any) -> None:
    """Marks the step whose forward runs through Keras's own `DistributedDataParallel`
    (a forward pre-hook on it, added once)."""
    from keras_mgpu_plugins.compat._torch import upstream_ddp_model

    ddp = upstream_ddp_model(model)
    if ddp is None or getattr(ddp, _HOOKED, False):
        return

    def mark(module: Any, args: Any) -> None:
        step = current()
        if step is not None:
            step.ddp_forward = True

    ddp.register_forward_pre_hook(mark)
    object.__setattr__(ddp, _HOOKED, True)
