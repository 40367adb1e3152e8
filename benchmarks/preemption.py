"""Preemption: the time from a stop signal to a written backup and to the exit, the steps
lost, and the weight difference of a stopped-and-resumed run against an uninterrupted one.

Runs `tests/scripts/preempt.py` (Dense 6-16-Dropout-1, Adam, 96 rows, batch 16, 3 epochs,
`shuffle=True`, seeded) under `kmp-launch -n 2` on the backend of this Python
(`KERAS_BACKEND`). Each repeat: once the chief has trained the second batch of epoch 2
(`--mark-at 1:1`), SIGTERM to `kmp-launch`, which forwards it; then the same command again,
to the end. Each batch end sleeps 0.2 s (`--slow 0.2`, after `BackupAndRestore`'s check):
steps of about 0.2 s. The times include the rest of the step in flight: `saved_step` 9 when
the forwarded signal (`kmp-launch` acts at its next poll, every 0.05 s) reached the workers
before the agreement of the batch after the mark, 10 when it came during that batch's sleep
and the workers stopped at the next agreement. Prints one JSON line per repeat and a summary:

- `to_backup_s`: from the signal to the backup's weights file written (its modification
  time: the rename of a complete file), `to_exit_s`: to `kmp-launch`'s exit (75);
- `steps_lost`: steps any worker trained beyond the backup's (its progress file, written at
  each batch end, against the backup's `batches_done`): 0 when every worker stopped at the
  backed-up step;
- `max_abs_diff`: the resumed run's weights against the uninterrupted run's (same count);
- `elastic_max_abs_diff` (`--elastic`): a backup of 2 workers resumed on 1, against the
  uninterrupted 2-worker run (without Dropout and shuffle: see `elastic_difference`);
- `check_ms_per_step` (`--overhead`): what watching for stop signals costs at
  `BackupAndRestore`'s defaults: the milliseconds per step of an uninterrupted `fit`
  (`--workers` processes, 4096 rows, 3 epochs of 256 steps, no sleep, `--plain`: no batch
  hook of the script's own) with `stop_signals=("SIGTERM", "SIGUSR1")` minus the same with
  `stop_signals=None`, each job's steady state (the median of epochs 2 and 3, each from its
  start to its end), jobs alternating, median of the pairs (`--pairs`); `check_pct` is that
  cost in % of a step. `sync_hook_ms_per_step`: what running Keras's batch-end hooks on the
  training thread alone costs (`stop_signals=None` and a batch-end hook that does nothing,
  against without it; 0 on TensorFlow, where Keras always runs them there).

`--stop-check-interval S` passes that setting to `BackupAndRestore`; `--package DIR` runs
the `keras_mgpu_plugins` in DIR (e.g. another checkout, to measure before a change) with
this checkout's scripts; `--no-resume` leaves out the resumed runs (a backend that cannot
resume mid-epoch).

    python benchmarks/preemption.py --repeats 5 --elastic --overhead
    KERAS_BACKEND=jax python benchmarks/preemption.py --repeats 5 --elastic --overhead
    python benchmarks/preemption.py --repeats 0 --overhead --workers 1
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "preempt.py"
#: Where `keras_mgpu_plugins` is imported from (`--package`), and options for every run.
SETTINGS: dict = {"package": ROOT, "options": ()}


def launch(folder: pathlib.Path, name: str, *options: str, workers: int = 2,
           signal_at_mark: bool = False, progress: bool = True) -> tuple[int, float | None, float]:
    """(exit code, signal time, exit time) of one `kmp-launch` (or one process) run."""
    out = str(folder / name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(SETTINGS["package"]), str(ROOT), os.environ.get("PYTHONPATH")]))}
    script = [str(SCRIPT), str(folder / "backup"), out, *(["--progress"] if progress else []),
              *SETTINGS["options"], *options]
    command = ([sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", str(workers), *script]
               if workers > 1 else [sys.executable, *script])
    proc = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    sent = None
    if signal_at_mark:
        while not os.path.exists(out + ".mark") and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        sent = time.time()
    _, err = proc.communicate(timeout=600)
    if proc.returncode not in (0, 75):
        raise RuntimeError(f"{name}: exit code {proc.returncode}\n{err[-3000:]}")
    return proc.returncode, sent, time.time()


def repeat(folder: pathlib.Path, expected: np.ndarray | None) -> dict:
    code, sent, ended = launch(folder, "stopped", "--mark-at", "1:1", "--slow", "0.2",
                               signal_at_mark=True)
    weights = folder / "backup" / "latest.weights.h5"
    with open(folder / "backup" / "training_metadata.json") as f:
        record = json.load(f)
    steps = 6  # 96 rows / 16
    saved_step = record["epoch"] * steps + record["batches_done"]
    trained = []
    for progress in folder.glob("stopped.progress-*"):
        epoch, batch = map(int, progress.read_text().split())
        trained.append(epoch * steps + batch + 1)
    result = {"exit_code": code, "to_backup_s": round(weights.stat().st_mtime - sent, 3),
              "to_exit_s": round(ended - sent, 3), "saved_step": saved_step,
              "steps_lost": max(trained) - saved_step}
    if expected is None:
        return result
    launch(folder, "resumed", "--slow", "0")
    result["max_abs_diff"] = float(np.abs(np.load(folder / "resumed.npy") - expected).max())
    return result


def elastic_difference(folder: pathlib.Path) -> float:
    """A backup of 2 workers resumed on 1, against the uninterrupted 2-worker run (no Dropout:
    TensorFlow draws its masks per replica; no shuffle: JAX shuffles one process's rows
    with Keras's order, several processes' with kmp's)."""
    plain = ("--dropout", "0", "--no-shuffle")
    folder.mkdir()
    launch(folder, "uninterrupted", *plain, "--slow", "0")
    (folder / "uninterrupted.npy").rename(folder / "expected.npy")
    launch(folder, "stopped", *plain, "--signal-at", "1:2:1")
    launch(folder, "resumed", *plain, workers=1)
    return float(np.abs(np.load(folder / "resumed.npy") - np.load(folder / "expected.npy")).max())


def overhead(folder: pathlib.Path, pairs: int, workers: int = 2) -> dict:
    """Milliseconds per step (steady state) with and without watching for stop signals, and
    with a batch-end hook that does nothing, jobs alternating."""
    folder.mkdir()
    rows, epochs, batch = 4096, 3, 16
    steps = rows // batch
    variants = {"watching": (), "not_watching": ("--no-stop-signals",),
                "sync_hook": ("--no-stop-signals", "--sync-hook")}
    per_step: dict[str, list[float]] = {key: [] for key in variants}
    for i in range(pairs):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for key in order:
            name = f"{key}-{i}"
            launch(folder, name, "--rows", str(rows), "--epochs", str(epochs), "--plain",
                   *variants[key], progress=False, workers=workers)
            with open(folder / f"{name}.json") as f:
                epoch_s = json.load(f)["epoch_s"]
            per_step[key].append(statistics.median(epoch_s[1:]) / steps)
    ms = {key: statistics.median(values) * 1e3 for key, values in per_step.items()}
    return {"workers": workers, "ms_per_step_watching": round(ms["watching"], 3),
            "ms_per_step_not_watching": round(ms["not_watching"], 3),
            "check_ms_per_step": round(ms["watching"] - ms["not_watching"], 3),
            "check_pct": round(100 * (ms["watching"] - ms["not_watching"]) / ms["not_watching"], 2),
            "sync_hook_ms_per_step": round(ms["sync_hook"] - ms["not_watching"], 3),
            "per_pair_ms": {k: [round(v * 1e3, 3) for v in vs] for k, vs in per_step.items()},
            "overhead_pairs": pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--elastic", action="store_true")
    parser.add_argument("--overhead", action="store_true")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="processes of --overhead's jobs")
    parser.add_argument("--stop-check-interval", type=float, default=None)
    parser.add_argument("--package", default=str(ROOT),
                        help="the folder whose keras_mgpu_plugins the runs import")
    parser.add_argument("--no-resume", action="store_true")
    args = parser.parse_args()
    SETTINGS["package"] = pathlib.Path(args.package).resolve()
    if args.stop_check_interval is not None:
        SETTINGS["options"] = ("--stop-check-interval", str(args.stop_check_interval))
    base = pathlib.Path(tempfile.mkdtemp(prefix="kmp-preemption-"))
    try:
        summary: dict = {"backend": os.environ.get("KERAS_BACKEND", "tensorflow"),
                         "repeats": args.repeats, "package": str(SETTINGS["package"]),
                         "stop_check_interval": args.stop_check_interval}
        if args.repeats:
            expected = None
            if not args.no_resume:
                launch(base, "uninterrupted")
                expected = np.load(base / "uninterrupted.npy")
            results = []
            for i in range(args.repeats):
                folder = base / f"repeat-{i}"
                folder.mkdir()
                results.append(repeat(folder, expected))
                print(json.dumps(results[-1]), flush=True)
            summary.update({key: statistics.median(r[key] for r in results)
                            for key in ("to_backup_s", "to_exit_s", "steps_lost")})
            summary.update(steps_lost_max=max(r["steps_lost"] for r in results),
                           to_backup_s_max=max(r["to_backup_s"] for r in results))
            if expected is not None:
                summary["max_abs_diff"] = max(r["max_abs_diff"] for r in results)
        if args.elastic:
            summary["elastic_max_abs_diff"] = elastic_difference(base / "elastic")
        if args.overhead:
            summary.update(overhead(base / "overhead", args.pairs, args.workers))
        print("median", json.dumps(summary), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
