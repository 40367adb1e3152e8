"""Model parallelism on JAX: the bytes each device holds, unsharded against sharded.

An MLP of DEPTH square Dense layers is sized so that its parameters and Adam slots need
`--ratio` (default 1.25) times the memory budget of one device (`--budget-mb`). Three
cases, each in a fresh process (JAX's device count and its peak memory are per process),
each training `--steps` steps of batch 8:

- one device: plain Keras, no distribution (everything on the first device);
- data parallel: `@kmp.parallelize(strategy="mirrored", devices=...)` (every device holds
  the whole model);
- sharded: `@kmp.parallelize(strategy="model_parallel", devices=...)`.

Per device, after the steps: the bytes of the model's variables and of the optimizer's
variables it holds (each array's `addressable_shards`), the bytes of every live array
(`jax.live_arrays()`), and the peak bytes in use (`Device.memory_stats()
["peak_bytes_in_use"]`, since the process started) where the platform reports it; JAX's
CPU devices report none (said so, no number made up). Without `--devices` GPUs (or with
`--platform cpu`) the host is split into `--devices` CPU devices, and the budget is a
stated figure: the run shows the unsharded model needing more than it, the sharded one
holding less on each device. With the GPUs, the budget is still the stated figure; the
peaks are the platform's.

    KERAS_BACKEND=jax python benchmarks/model_parallel_memory.py [--quick] [--budget-mb 1024]
        [--ratio 1.25] [--steps 3] [--devices 2] [--platform auto|cpu|gpu]
    python benchmarks/model_parallel_memory.py --backend jax ...   (the same)

Prints a table and, last, a line `RESULT {json}`. Imports no TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

DEPTH, BATCH, SLOTS = 8, 8, 2  # Adam: 2 slots per parameter
CASES = {"one_device": "one device", "data_parallel": "data parallel", "sharded": "sharded"}
MIB = 2**20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model (CPU: seconds)")
    parser.add_argument("--budget-mb", type=float, default=None,
                        help="memory budget of one device, MiB (default 1024; --quick: 64)")
    parser.add_argument("--ratio", type=float, default=1.25,
                        help="parameters + Adam slots as a multiple of the budget")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--devices", type=int, default=2, help="devices to shard over")
    parser.add_argument("--platform", choices=["auto", "cpu", "gpu"], default="auto",
                        help="auto: the GPUs if there are --devices of them, else CPU devices")
    parser.add_argument("--case", choices=list(CASES), default=None,
                        help=argparse.SUPPRESS)  # one case in this process (the children)
    parser.add_argument("--json", metavar="PATH", help="write the results there as JSON")
    return parser.parse_args(argv)


def width_for(budget_bytes: float, ratio: float, devices: int) -> int:
    """The MLP width whose DEPTH square layers' weights and Adam slots need ratio * budget,
    a multiple of `devices` (an indivisible kernel would be replicated, not sharded)."""
    params = ratio * budget_bytes / (1 + SLOTS) / 4  # float32
    width = max(16, int((params / DEPTH) ** 0.5))
    return max(devices, width - width % devices)


def need_bytes(width: int) -> int:
    return DEPTH * (width * width + width) * 4 * (1 + SLOTS)


def build(width: int):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((width,))
    h = inputs
    for i in range(DEPTH):
        h = keras.layers.Dense(width, activation="relu", name=f"layer_{i}")(h)
    model = keras.Model(inputs, h)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    return model


def choose_platform(platform: str, n: int) -> str:
    """`"gpu"` or `"cpu"`, decided before JAX's backend starts (CPU devices are split then)."""
    if platform != "auto":
        return platform
    from keras_mgpu_plugins.backends.jax.devices import planned_device_names

    gpus = [d for d in planned_device_names() if d.startswith("GPU")]
    return "gpu" if len(gpus) >= n else "cpu"


def per_device(arrays, devices) -> dict[str, int]:
    """Bytes of `arrays` on each of `devices`, each buffer counted once: a shard's
    single-device array (`shard.data`, itself a live array) shares its parent's buffer."""
    found, seen = dict.fromkeys(devices, 0), set()
    for array in arrays:
        for shard in array.addressable_shards:
            name = f"{shard.device.platform}:{shard.device.id}"
            buffer = (name, shard.data.unsafe_buffer_pointer())
            if name in found and buffer not in seen:
                seen.add(buffer)
                found[name] += int(shard.data.nbytes)
    return found


def run_case(case: str, width: int, steps: int, n: int, platform: str) -> dict:
    """One case in this process: train `steps` steps, report each device's bytes."""
    import keras_mgpu_plugins as kmp

    platform = choose_platform(platform, n)
    if platform == "cpu":
        kmp.simulate_devices(n)  # before JAX's backend starts
    import jax
    import numpy as np

    local = [d for d in jax.local_devices() if d.platform == platform][:n]
    if len(local) < n:
        raise SystemExit(f"--devices {n}: this process has {len(local)} {platform} device(s)")
    names = [f"{d.platform}:{d.id}" for d in local]
    factory = {"one_device": build,
               "data_parallel": kmp.parallelize(build, strategy="mirrored", devices=names),
               "sharded": kmp.parallelize(build, strategy="model_parallel", devices=names)}[case]
    model = factory(width)
    x = np.random.default_rng(0).normal(size=(BATCH * steps, width)).astype("float32")
    model.fit(x, x, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    tracked = {id(v) for v in model.weights}
    stats = [d.memory_stats() for d in local]
    return {
        "case": case, "platform": platform, "devices": names,
        "parameters": per_device([v.value for v in model.weights], names),
        "optimizer": per_device([v.value for v in model.optimizer.variables
                                 if id(v) not in tracked], names),
        "live_after_step": per_device(jax.live_arrays(), names),
        "peak": {name: (int(s["peak_bytes_in_use"]) if s and "peak_bytes_in_use" in s else None)
                 for name, s in zip(names, stats, strict=True)},
        "bytes_limit": {name: (int(s["bytes_limit"]) if s and "bytes_limit" in s else None)
                        for name, s in zip(names, stats, strict=True)},
    }


def child(case: str, args: argparse.Namespace, budget_mb: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--case", case, "--budget-mb",
           str(budget_mb), "--ratio", str(args.ratio), "--steps", str(args.steps),
           "--devices", str(args.devices), "--platform", args.platform]
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")), None)
    if line is None:
        raise RuntimeError(f"case {case} failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    return json.loads(line[5:])


def summary(res: dict, budget: float) -> dict:
    """Per case: the most bytes (parameters + optimizer) any device holds, its share of the
    budget, and the most live bytes / peak of any device (peak `None`: not reported)."""
    held = {d: res["parameters"][d] + res["optimizer"][d] for d in res["devices"]}
    peaks = list(res["peak"].values())
    return {"held_max": max(held.values()), "of_budget": max(held.values()) / budget,
            "live_max": max(res["live_after_step"].values()),
            "peak_max": None if None in peaks else max(peaks)}


def measure(budget_mb: float, ratio: float = 1.25, steps: int = 3, devices: int = 2,
            platform: str = "auto") -> dict:
    """The three cases, each in a fresh process; what `main` prints, as a dict."""
    args = argparse.Namespace(ratio=ratio, steps=steps, devices=devices, platform=platform)
    budget = budget_mb * MIB
    width = width_for(budget, ratio, devices)
    cases = {case: child(case, args, budget_mb) for case in CASES}
    sums = {case: summary(res, budget) for case, res in cases.items()}
    ratios = {"sharded / one device": sums["sharded"]["held_max"] / sums["one_device"]["held_max"],
              "sharded / data parallel":
                  sums["sharded"]["held_max"] / sums["data_parallel"]["held_max"]}
    if all(s["peak_max"] is not None for s in sums.values()):
        ratios["peak, sharded / one device"] = (sums["sharded"]["peak_max"]
                                                / sums["one_device"]["peak_max"])
    return {"budget_bytes": budget, "need_bytes": need_bytes(width), "width": width,
            "depth": DEPTH, "steps": steps, "platform": cases["sharded"]["platform"],
            "devices": cases["sharded"]["devices"], "cases": cases, "summary": sums,
            "ratios": ratios,
            "unsharded_over_budget": sums["one_device"]["held_max"] > budget,
            "sharded_under_budget": sums["sharded"]["held_max"] < budget}


def report(r: dict) -> None:
    budget = r["budget_bytes"]
    print(f"\nMLP {r['depth']} x {r['width']}, Adam: parameters + slots "
          f"{r['need_bytes'] / MIB:.1f} MiB = {r['need_bytes'] / budget:.2f} x the budget of "
          f"{budget / MIB:g} MiB per device; {len(r['devices'])} {r['platform']} devices, "
          f"{r['steps']} steps of batch {BATCH}")
    print(f"{'case':14} {'device':7} {'parameters':>11} {'optimizer':>11} {'held':>11} "
          f"{'of budget':>9} {'live after step':>15}  peak during the steps")
    for case, res in r["cases"].items():
        for d in res["devices"]:
            held = res["parameters"][d] + res["optimizer"][d]
            peak = res["peak"][d]
            print(f"{CASES[case]:14} {d:7} {_mib(res['parameters'][d])} {_mib(res['optimizer'][d])} "
                  f"{_mib(held)} {held / budget:>9.0%} {_mib(res['live_after_step'][d], 15)}  "
                  + (f"{peak / MIB:,.1f} MiB ({peak / budget:.0%})" if peak is not None
                     else "not reported by the platform"))
    print("ratios, most bytes held by a device (this run): " + "; ".join(
        f"{k} {v:.3f}x" for k, v in r["ratios"].items()))
    one, sharded = r["summary"]["one_device"], r["summary"]["sharded"]
    print(f"one device holds {one['of_budget']:.2f} x the budget "
          f"({'over' if r['unsharded_over_budget'] else 'NOT over'} it); sharded, each device "
          f"at most {sharded['of_budget']:.2f} x ({'under' if r['sharded_under_budget'] else 'NOT under'} it)")


def _mib(n: int, width: int = 11) -> str:
    return f"{n / MIB:,.1f} MiB".rjust(width)


def main(argv=None) -> dict:
    args = parse_args(argv)
    budget_mb = args.budget_mb or (64 if args.quick else 1024)
    width = width_for(budget_mb * MIB, args.ratio, args.devices)
    if args.case:
        print("CASE " + json.dumps(run_case(args.case, width, args.steps, args.devices,
                                            args.platform)))
        return {}
    result = measure(budget_mb, args.ratio, args.steps, args.devices, args.platform)
    report(result)
    print("RESULT " + json.dumps(result))
    suite_report(result, args).finish(args.json)
    return result


def suite_report(r: dict, args: argparse.Namespace):
    """The results as `benchmarks/_suite.py` writes them."""
    from _suite import Report

    report = Report("model_parallel_memory_jax", "JAX: the bytes a device holds, unsharded "
                    "against strategy='model_parallel'", args.quick)
    how = (f"MLP {DEPTH} x {r['width']}, Adam: parameters + slots {r['need_bytes'] / r['budget_bytes']:.2f}x "
           f"a budget of {r['budget_bytes'] / MIB:g} MiB per device, {len(r['devices'])} "
           f"{r['platform']} devices, after {args.steps} steps")
    report.ratio("sharded_under_budget", "sharded (model_parallel): most bytes a device holds / "
                 "the budget", r["summary"]["sharded"]["of_budget"], ("<=", 1.0), [], how)
    for name, value in r["ratios"].items():
        report.ratio(name.replace(", ", "_").replace(" / ", "_vs_").replace(" ", "_"),
                     f"{name}: most bytes a device holds", value, None, [], how)
    for case, label in CASES.items():
        report.row(f"{label}: most bytes a device holds", r["summary"][case]["held_max"] / MIB, "MiB")
    return report


if __name__ == "__main__":
    main()
