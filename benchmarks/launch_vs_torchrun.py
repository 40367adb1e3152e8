"""kmp-launch against torchrun on torch: the wall time of the same 2-process script.

Runs `examples/quickstart.py` (a small CNN with kmp's callbacks, `@kmp.parallelize`, one
process per CPU device over gloo) as

- `python -m keras_mgpu_plugins.launch -n 2 examples/quickstart.py` (kmp-launch), and
- `python -m torch.distributed.run --nproc-per-node 2 examples/quickstart.py` (torchrun),

each with its launcher's defaults (no thread setting of ours; `KERAS_BACKEND=torch`, no GPU),
alternating for `--rounds` rounds (kmp-launch first in even rounds), and reports the median
over the rounds of each round's wall-time ratio kmp-launch / torchrun (goal: within 10%,
<= 1.10), and each side's median wall time. Imports and process start-up count on both sides.

    KERAS_BACKEND=torch python benchmarks/launch_vs_torchrun.py [--quick] [--rounds 3]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from _suite import Report, add_arguments, median_ratio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "quickstart.py")
LAUNCHERS = {"kmp-launch": [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2"],
             "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]}
#: The goal of issue 40: kmp-launch within 10% of torchrun's wall time.
GOAL = ("<=", 1.10)


def wall(launcher: str, script_args: list[str], timeout: float) -> float:
    """Seconds from the launcher's start to its exit (which must be 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KMP_", "TF_CONFIG"))}
    env.update(KERAS_BACKEND="torch", CUDA_VISIBLE_DEVICES="")
    start = time.perf_counter()
    done = subprocess.run([*LAUNCHERS[launcher], SCRIPT, *script_args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{launcher} exited {done.returncode}:\n{done.stdout[-2000:]}"
                           f"\n{done.stderr[-3000:]}")
    return seconds


def measure(rounds: int, script_args: list[str], timeout: float = 1800) -> dict:
    walls: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    for r in range(rounds):
        for name in LAUNCHERS if r % 2 == 0 else list(LAUNCHERS)[::-1]:
            walls[name].append(wall(name, script_args, timeout))
        print(f"  round {r + 1}: " + "  ".join(f"{n} {w[-1]:.1f} s" for n, w in walls.items()),
              flush=True)
    ratio, ratios = median_ratio(walls["kmp-launch"], walls["torchrun"])
    return {"ratio": ratio, "ratios": ratios,
            **{name: statistics.median(w) for name, w in walls.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    args = parser.parse_args(argv)
    rounds, script_args = (1, ["--epochs", "1"]) if args.quick else (args.rounds, [])
    r = measure(rounds, script_args)
    report = Report("launch_vs_torchrun", "kmp-launch against torchrun, torch, 2 processes",
                    args.quick)
    report.ratio("torchrun", "kmp-launch / torchrun, wall time of examples/quickstart.py "
                 f"{' '.join(script_args)}".rstrip(), r["ratio"], GOAL, r["ratios"],
                 "2 processes on CPUs (gloo), each launcher's defaults, from the launcher's start "
                 f"to its exit, median of {rounds} alternating rounds")
    for name in LAUNCHERS:
        report.row(name, r[name], "s", "wall time, median of the rounds")
    return report.finish(args.json)


if __name__ == "__main__":
    main()
