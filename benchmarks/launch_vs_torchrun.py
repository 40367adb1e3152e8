"""torch: the same 2-process script under `kmp-launch -n 2` and under `torchrun --nproc-per-node 2`.

The script is this file run with `--worker`: the MNIST-sized CNN of the user stories
(Conv2D 32 3x3, MaxPool, Flatten, Dense 128, Dense 10; Adam; 28x28x1 generated images),
`@kmp.parallelize` (which joins the process group either launcher set up), one `fit` of
`--rows` rows at a global batch of 64 after a warm-up of 4 steps; rank 0 writes its `fit`
seconds. Both launchers get the same environment (`KERAS_BACKEND=torch`, no GPU, no thread
variable of the caller's: each launcher sets its own, as it does for a user). The sides
alternate for `--rounds` rounds (kmp-launch first in even rounds); each job's wall time
(from the command's start to its exit: imports, process group, training) and `fit` time are
recorded, and the medians and the ratio kmp-launch / torchrun reported (goal: at most 1.10).

    python benchmarks/launch_vs_torchrun.py [--quick] [--rounds 3] [--rows 8192] [--json PATH]

Run it with the torch lane's Python (its `torchrun` is used: `python -m torch.distributed.run`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from _suite import Report, add_arguments, median_ratio

ROOT = pathlib.Path(__file__).resolve().parents[1]
BATCH = 64
#: The goal of issue 40: kmp-launch within 10% of torchrun's wall time.
GOAL = ("<=", 1.10)
#: Thread variables removed from the launchers' environment: each launcher sets its own.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
               "TF_NUM_INTEROP_THREADS", "XLA_FLAGS")


def worker(rows: int, out: str) -> None:
    """One process of the job (either launcher): build, warm up, time one `fit`."""
    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp

    @kmp.parallelize
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model = build()
    rng = np.random.default_rng(0)
    x = rng.random((rows, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, rows)
    model.fit(x[:4 * BATCH], y[:4 * BATCH], batch_size=BATCH, verbose=0)  # warm-up
    began = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, verbose=0)
    seconds = time.perf_counter() - began
    if kmp.topology().is_chief:
        import torch

        with open(out, "w") as f:
            json.dump({"fit_s": seconds, "steps": rows // BATCH,
                       "intra_op": torch.get_num_threads(),
                       "inter_op": torch.get_num_interop_threads(),
                       "omp": os.environ.get("OMP_NUM_THREADS")}, f)


def _job(side: str, rows: int, folder: pathlib.Path, index: int) -> dict:
    out = folder / f"{side}-{index}.json"
    script = [str(pathlib.Path(__file__).resolve()), "--worker", "--rows", str(rows),
              "--out", str(out)]
    if side == "kmp-launch":
        command = [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2", *script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--master-port", str(29500 + index), *script]
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update(KERAS_BACKEND="torch", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    began = time.perf_counter()
    proc = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=1800)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{side}: exit code {proc.returncode}\n{proc.stderr[-3000:]}")
    record = json.loads(out.read_text())
    startup = [line for line in proc.stderr.splitlines() if line.startswith(side)]
    return {"side": side, "wall_s": round(wall, 3), "fit_s": round(record["fit_s"], 3),
            "ms_per_step": round(1e3 * record["fit_s"] / record["steps"], 2),
            "threads": {k: record[k] for k in ("intra_op", "inter_op", "omp")},
            "launcher_says": startup[:1]}


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=8192)
    add_arguments(parser, rounds=3)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.rows, args.out)
        return None
    rows, rounds = (512, 1) if args.quick else (args.rows, args.rounds)
    report = Report("launch_vs_torchrun", "kmp-launch against torchrun, torch, 2 processes",
                    args.quick)
    jobs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kmp-launch-vs-torchrun-") as tmp:
        for r in range(rounds):
            order = ("kmp-launch", "torchrun") if r % 2 == 0 else ("torchrun", "kmp-launch")
            for side in order:
                jobs.append(_job(side, rows, pathlib.Path(tmp), len(jobs)))
                print(json.dumps(jobs[-1]), flush=True)
    sides = {side: [j for j in jobs if j["side"] == side] for side in ("kmp-launch", "torchrun")}
    for key, what in (("wall_s", "wall time"), ("fit_s", "fit time")):
        ratio, ratios = median_ratio([j[key] for j in sides["kmp-launch"]],
                                     [j[key] for j in sides["torchrun"]])
        report.ratio(f"torchrun_{key}", f"kmp-launch / torchrun, {what} of the CNN, {rows} rows",
                     ratio, GOAL if key == "wall_s" else None, ratios,
                     "2 processes on CPUs (gloo), each launcher's defaults, median of "
                     f"{rounds} alternating rounds")
    for side, found in sides.items():
        report.row(f"{side} wall", statistics.median(j["wall_s"] for j in found), "s",
                   "from the command's start to its exit")
        report.row(f"{side} step", statistics.median(j["ms_per_step"] for j in found), "ms",
                   f"fit of {rows} rows at a global batch of {BATCH}; threads "
                   f"{found[0]['threads']}")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
