"""End-of-training outputs on the chief: the summary table and the plot."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from keras_mgpu_plugins.samplers.base import DEVICE_FIELDS, HOST_FIELDS
from keras_mgpu_plugins.samplers.records import RUN_FIELDS, WorkerRecord, _nan_reduce

DEVICE_COLUMNS = (
    ("memory MB", "memory_mb", "last"),
    ("peak MB", "peak_memory_mb", "max"),
    ("util %", "utilization_pct", "mean"),
    ("power W", "power_w", "mean"),
    ("temp C", "temperature_c", "max"),
)
HOST_COLUMNS = (
    ("RSS MB", "memory_mb", "last"),
    ("peak RSS MB", "memory_mb", "max"),
    ("CPU %", "cpu_pct", "mean"),
    ("TF host MB", "tf_peak_memory_mb", "max"),  # TensorFlow's host allocator: its lane only
)


def summary_table(
    epochs: Sequence[Sequence[WorkerRecord]],
    run: np.ndarray,
    steps: int,
    batch_size: int | None = None,
    replicas: int = 1,
) -> str:
    """The per-device table the chief prints at the end of training.

    Args:
        epochs: Each epoch's records, one per worker.
        run: The run's step statistics, in `RUN_FIELDS` order.
        steps: Batches timed over the run.
        batch_size: Global batch size, for samples per second.
        replicas: Replicas in sync, for the per-replica rate.

    Returns:
        The table, as lines of text.
    """
    stats = dict(zip(RUN_FIELDS, run, strict=True))
    head = (
        f"Device metrics over {len(epochs)} epoch(s), {steps} timed step(s): step time "
        f"mean {_f(stats['step_time/mean_ms'])} ms, p50 {_f(stats['step_time/p50_ms'])} ms, "
        f"p95 {_f(stats['step_time/p95_ms'])} ms"
    )
    if batch_size is not None:
        rate = batch_size * stats["throughput/steps_per_sec"]
        head += f"; {_f(rate)} samples/s ({_f(rate / max(1, replicas))} per replica)"
    lines = [head]
    if not epochs:
        return "\n".join(lines)
    workers = len(epochs[-1])
    rows = []
    for w in range(workers):
        for name in epochs[-1][w].devices:
            series = [e[w].devices[name] for e in epochs if name in e[w].devices]
            rows.append([str(w), name, *(_over(series, f, how) for _, f, how in DEVICE_COLUMNS)])
    if rows:
        lines += _table(*_known(["worker", "device", *(c for c, _, _ in DEVICE_COLUMNS)], rows))
    else:
        lines.append("GPU metrics unavailable (no GPU): host metrics only.")
    host_rows = [
        [str(w), "host", *(_over([e[w].host for e in epochs], f, how) for _, f, how in HOST_COLUMNS)]
        for w in range(workers)
    ]
    lines += _table(*_known(["worker", "", *(c for c, _, _ in HOST_COLUMNS)], host_rows))
    return "\n".join(lines)


def _known(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The table without the columns no row has a figure for (`-` throughout): a figure the
    lane does not have (TensorFlow's host allocator on JAX or torch, NVML's without it)."""
    keep = [i for i in range(len(header)) if i < 2 or any(r[i] != "-" for r in rows)]
    return [header[i] for i in keep], [[r[i] for i in keep] for r in rows]


def _over(series: Sequence[dict[str, float]], field: str, how: str) -> str:
    values = [s.get(field, math.nan) for s in series]
    if how == "last":
        present = [v for v in values if not math.isnan(v)]
        return _f(present[-1] if present else math.nan)
    return _f(_nan_reduce(np.max if how == "max" else np.mean, values))


def _f(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header), *(fmt.format(*r) for r in rows)]


def plot_run(
    path: str,
    times: np.ndarray,
    series: np.ndarray,
    device_names: Sequence[Sequence[str]],
    epoch_ends: Sequence[float] = (),
    framework: str = "the framework",
) -> str:
    """Draws memory and utilisation over the run, one line per device, to a PNG.

    Args:
        path: The PNG file to write.
        times: Seconds since training started, `(points,)`.
        series: Readings, `(workers, points, fields)` (host fields, then devices).
        device_names: Each worker's device names.
        epoch_ends: Seconds at which epochs ended, drawn as faint lines.
        framework: Whose allocator the device memory is (`"TensorFlow"`, `"JAX"`, `"torch"`).

    Returns:
        `path`.
    """
    from matplotlib.figure import Figure

    nh, nd = len(HOST_FIELDS), len(DEVICE_FIELDS)
    multi = len(device_names) > 1
    lines: dict[str, list[tuple[str, np.ndarray, int, int]]] = {"memory": [], "util": [], "rss": [], "cpu": []}
    for w, names in enumerate(device_names):
        for i, name in enumerate(names):
            label = f"worker{w} {name}" if multi else name
            base = nh + i * nd
            lines["memory"].append((label, series[w, :, base + DEVICE_FIELDS.index("memory_mb")], w, i))
            lines["util"].append((label, series[w, :, base + DEVICE_FIELDS.index("utilization_pct")], w, i))
        host = f"worker{w} host" if multi else "host (this process)"
        lines["rss"].append((host, series[w, :, HOST_FIELDS.index("memory_mb")], w, w))
        lines["cpu"].append((host, series[w, :, HOST_FIELDS.index("cpu_pct")], w, w))
    has = {k: any(np.isfinite(v).any() for _, v, _, _ in ls) for k, ls in lines.items()}
    panels = [
        ("memory", f"GPU memory in use ({framework}'s allocator)", "MB")
        if has["memory"] else ("rss", "Host memory (process RSS) - no GPU memory reported", "MB"),
        ("util", "GPU utilisation (NVML)", "%")
        if has["util"] else ("cpu", "Host CPU use - GPU utilisation unavailable", "% of one core"),
    ]
    # colour: the device (or the worker, for host lines); line style: the worker
    count = 1 + max((c for p in panels for _, _, _, c in lines[p[0]]), default=0)
    fig = Figure(figsize=(11, 6.5), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    cmap = _colors(count)
    styles = ["-", "--", ":", "-."]
    labels = [[label for label, _, _, _ in lines[key]] for key, _, _ in panels]
    for p, (ax, (key, title, unit)) in enumerate(zip(axes, panels, strict=True)):
        for label, values, worker, color in lines[key]:
            ax.plot(times, values, label=label, color=cmap[color % len(cmap)],
                    linestyle=styles[worker % len(styles)] if multi else "-", linewidth=1.6)
        for t in epoch_ends:
            ax.axvline(t, color="0.55", linewidth=0.9, linestyle=(0, (4, 3)), zorder=0)
        ax.set_title(title, loc="left", fontsize=11)
        ax.set_ylabel(unit)
        ax.grid(True, axis="y", alpha=0.3)
        top = max([float(np.nanmax(v)) for _, v, _, _ in lines[key] if np.isfinite(v).any()] or [0.0])
        ax.set_ylim(0, 100 if unit == "%" else max(top, 1e-9) * 1.15)
        if p == 0 or labels[p] != labels[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                      ncol=1 if len(lines[key]) <= 16 else 2)
    if 0 < len(epoch_ends) <= 30:
        for number, t in enumerate(epoch_ends, start=1):
            axes[0].annotate(f"epoch {number}", (t, 1.0), xycoords=("data", "axes fraction"),
                             xytext=(-3, -3), textcoords="offset points", ha="right", va="top",
                             fontsize=7, color="0.35")
    axes[-1].set_xlabel("time since training started (s); dashed lines: ends of epochs")
    fig.suptitle("Device metrics over the run", fontsize=13)
    directory = os.path.dirname(os.fspath(path))
    if directory:
        os.makedirs(directory, exist_ok=True)
    fig.savefig(path, dpi=110)
    return os.fspath(path)


def _colors(count: int) -> list:
    from matplotlib import colormaps

    name = "tab10" if count <= 10 else "tab20"
    return list(colormaps[name].colors)
