"""The efficiency keys of a device-metrics record: FLOPs, MFU, phases, stragglers, cost.

Pure numbers in, keys out (no Keras): each worker's `WorkerRecord.run` holds what it
measured (`records.WIRE_RUN_FIELDS`), gathered by one all-gather per record.

MFU (model FLOPs utilisation) = the model's FLOPs per step (counted once per compiled step
function, forward and backward, at the step's batch: `flops/per_step`) x steps per second
/ the sum of the devices' peak FLOP/s (`samplers.peaks`), in percent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from keras_mgpu_plugins.samplers import stragglers as strag

NAN = math.nan
PHASE_KEYS = ("input_ms", "host_ms", "compute_ms")


def check_positive(name: str, value: object) -> float | None:
    """`value` as a float, or `None`; refuses what is not a positive finite number.

    Raises:
        ValueError: Naming `name` and the value received.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number or None. Received: {name}={value!r}")
    return float(value)


def check_prices(per_device: object, per_worker: object) -> tuple[float | None, float | None]:
    """`cost_per_device_hour` and `cost_per_worker_hour`, checked: positive numbers, one at most.

    Raises:
        ValueError: Naming the argument and the value received.
    """
    device = check_positive("cost_per_device_hour", per_device)
    worker = check_positive("cost_per_worker_hour", per_worker)
    if device is not None and worker is not None:
        raise ValueError("Pass cost_per_device_hour or cost_per_worker_hour, not both. Received: "
                         f"cost_per_device_hour={per_device!r}, cost_per_worker_hour={per_worker!r}")
    return device, worker


def samples_per_step(runs: Sequence[dict[str, float]], batch_size: int | None) -> float:
    """Global rows per step: `batch_size` if given, else the rows every worker counted, else
    the rows of the first batch the step was seen with (global on JAX)."""
    if batch_size is not None:
        return float(batch_size)
    counted = sum(r.get("rows_per_batch", NAN) for r in runs)
    if math.isfinite(counted) and counted > 0:
        return counted
    return runs[0].get("observed_rows", NAN)


def keys(runs: Sequence[dict[str, float]], batch_size: int | None, cost_per_hour: float | None,
         elapsed: tuple[float, float]) -> dict[str, float]:
    """The efficiency keys of one record.

    Args:
        runs: Each worker's run fields (`WorkerRecord.run`), worker 0 first.
        batch_size: The logger's `batch_size`, or `None`.
        cost_per_hour: What the whole job costs per hour, or `None` (no `cost/` keys).
        elapsed: Seconds of the epoch so far and of the run so far.
    """
    chief, multi = runs[0], len(runs) > 1
    out: dict[str, float] = {}
    samples = samples_per_step(runs, batch_size)
    flops = chief.get("flops_per_sample", NAN) * samples
    steps_per_sec = chief["throughput/steps_per_sec"]
    tflops = flops * steps_per_sec / 1e12
    devices = sum(r.get("devices", NAN) for r in runs)
    peak = sum(r.get("peak_tflops", NAN) for r in runs)
    out["flops/per_step"] = flops
    out["throughput/tflops"] = tflops
    out["throughput/tflops_per_device"] = tflops / devices if devices > 0 else NAN
    out["throughput/tokens_per_sec"] = chief.get("tokens_per_sample", NAN) * samples * steps_per_sec
    out["efficiency/mfu_pct"] = 100.0 * tflops / peak if peak > 0 else NAN
    for index, run in enumerate(runs):
        scope = f"worker{index}/" if multi else ""
        for key in PHASE_KEYS:
            out[f"phase/{scope}{key}"] = run.get(f"phase_{key}", NAN)
        other = run.get("phase_input_other_ms", NAN)  # read ahead on tf.data's threads
        if math.isfinite(other):
            out[f"phase/{scope}input_ms"] += other
    if multi:
        found = strag.find(phases_ms(runs), step_ms(runs))
        first = found[0] if found else None
        out["straggler/worker"] = float(first.worker) if first else -1.0
        out["straggler/phase"] = float(strag.PHASE_CODES[first.phase]) if first else 0.0
        out["straggler/excess_ms"] = first.excess_ms if first else 0.0
    if cost_per_hour is not None:
        epoch_s, run_s = elapsed
        out["cost/per_step"] = cost_per_hour * chief["step_time/mean_ms"] / 1000 / 3600
        out["cost/epoch"] = cost_per_hour * epoch_s / 3600
        out["cost/run"] = cost_per_hour * run_s / 3600
    return out


def phases_ms(runs: Sequence[dict[str, float]], typical: bool = True) -> np.ndarray:
    """`(workers, 4)` ms per step: input, host, compute, input read on other threads; the
    median over the steps (`typical`: what the straggler report compares, a one-off pause
    weighs nothing) or the mean."""
    names = ("input", "host", "compute", "input_other")
    fields = [f"phase_{n}_p50_ms" if typical else f"phase_{n}_ms" for n in names]
    return np.array([[r.get(f, NAN) for f in fields] for r in runs], dtype=np.float64)


def step_ms(runs: Sequence[dict[str, float]], typical: bool = True) -> np.ndarray:
    """Each worker's ms per step: the median (`typical`) or the mean."""
    field = "step_time/p50_ms" if typical else "step_time/mean_ms"
    return np.array([r.get(field, NAN) for r in runs], dtype=np.float64)


def over_epochs(epochs: Sequence[Sequence[dict[str, float]]]) -> list[dict[str, float]]:
    """Each worker's run fields over several records, weighted by their timed steps."""
    if not epochs:
        return []
    merged = []
    for w in range(len(epochs[-1])):
        rows = [e[w] for e in epochs if w < len(e)]
        weights = np.array([r.get("timed_steps", 0.0) for r in rows], dtype=np.float64)
        weights = np.where(np.isfinite(weights), weights, 0.0)
        out = dict(rows[-1])
        for field in (*(f"phase_{k}" for k in PHASE_KEYS), "phase_input_other_ms",
                      *(f"phase_{n}_p50_ms" for n in ("input", "host", "compute", "input_other")),
                      "step_time/mean_ms", "step_time/p50_ms"):
            values = np.array([r.get(field, NAN) for r in rows], dtype=np.float64)
            ok = np.isfinite(values) & (weights > 0)
            out[field] = float(np.average(values[ok], weights=weights[ok])) if ok.any() else NAN
        total = weights.sum()
        out["throughput/steps_per_sec"] = (1000.0 / out["step_time/mean_ms"]
                                           if total > 0 and out["step_time/mean_ms"] > 0 else NAN)
        merged.append(out)
    return merged


def summary(runs: Sequence[dict[str, float]], batch_size: int | None, run_seconds: float,
            cost_per_hour: float | None, reasons: Sequence[str] = ()) -> list[str]:
    """The summary's lines about efficiency, phases, stragglers and cost (the chief prints)."""
    if not runs:
        return []
    found = keys(runs, batch_size, cost_per_hour, (run_seconds, run_seconds))
    lines = []
    flops, mfu = found["flops/per_step"], found["efficiency/mfu_pct"]
    if math.isfinite(flops):
        line = (f"FLOPs: {flops / 1e9:.4g} GFLOP per step; {found['throughput/tflops']:.4g} "
                f"TFLOP/s for the job, {found['throughput/tflops_per_device']:.4g} per device")
        if math.isfinite(found["throughput/tokens_per_sec"]):
            line += f"; {found['throughput/tokens_per_sec']:.4g} tokens/s"
        lines.append(line + (f"; MFU {mfu:.2f}%" if math.isfinite(mfu) else "; MFU not available"))
    lines += [f"  ({reason})" for reason in reasons]
    phase_rows = []
    for w, run in enumerate(runs):
        other = run.get("phase_input_other_ms", NAN)
        other = other if math.isfinite(other) else 0.0
        values = [run.get(f"phase_{k}", NAN) + (other if k == "input_ms" else 0.0)
                  for k in PHASE_KEYS]
        text = ", ".join(f"{k[:-3]} {v:.1f}" for k, v in zip(PHASE_KEYS, values, strict=True))
        if other > 0.05:
            text += f" ({other:.1f} of the input read ahead on other threads)"
        phase_rows.append(f"worker {w}: {text}")
    lines.append("Time per step by phase (ms): " + "; ".join(phase_rows))
    if len(runs) > 1:
        ms, steps = phases_ms(runs), step_ms(runs)
        lines.append("Stragglers: " + strag.verdict(strag.find(ms, steps), ms, steps))
    if cost_per_hour is not None:
        cost = found["cost/run"]
        line = f"Cost: {cost:.4g} for the run ({found['cost/per_step']:.4g} per step)"
        if math.isfinite(mfu) and mfu > 0:
            line += f" at MFU {mfu:.2f}%; the same work would have cost "
            line += (f"{cost * mfu / 50:.4g} at 50% MFU, " if mfu < 50 else "")
            line += f"{cost * mfu / 100:.4g} at 100% (the devices' peak)"
        lines.append(line + ".")
    return lines
