"""Model parallelism: a model that does not fit in one device trains split over two.

On a GPU, the first GPU is split into 2 logical GPUs of `--limit-mb` each
(`kmp.simulate_devices(2, memory_limit_mb=...)`) and an MLP is sized so that its
parameters and Adam slots need `--ratio` (default 1.5) times one limit. Each case runs in
its own process (a fresh TensorFlow runtime). With `--optimizer sgd` (no slots) the
parameters alone need `--ratio` times one limit: the placed model's variables must never
all sit on one GPU, not even while the factory builds them.

- unplaced: the plain model on one logical GPU; expected: out of memory;
- placed: the same model from `@kmp.parallelize(strategy="model_parallel")`; expected:
  it trains, and the peak memory of each logical GPU
  (`tf.config.experimental.get_memory_info(...)["peak"]`) stays under the limit.

Without a GPU, TensorFlow enforces no memory limit: the script runs the placed case on 2
simulated CPU devices and reports the bytes per device from `kmp.placement_report`
(parameters, Adam slots, activations) against the notional limit.

    python benchmarks/model_parallel_memory.py [--quick] [--limit-mb 1024] [--ratio 1.5]
                                               [--optimizer adam|sgd]

Prints a table and, last, a line `RESULT {json}`.

On JAX (`KERAS_BACKEND=jax`, or `--backend jax`) the script is
`model_parallel_memory_jax.py`: the bytes each device holds, unsharded against
sharded, against a stated `--budget-mb`; it imports no TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
DEPTH = 8


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model (CPU: seconds)")
    parser.add_argument("--limit-mb", type=int, default=None,
                        help="memory of each logical GPU (default 1024; --quick: 64)")
    parser.add_argument("--ratio", type=float, default=1.5,
                        help="parameters + Adam slots as a multiple of one limit")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam",
                        help="adam: 2 slots per parameter; sgd: none")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--case", choices=["unplaced", "placed"], default=None,
                        help=argparse.SUPPRESS)  # one case in this process (the children)
    parser.add_argument("--json", metavar="PATH", help="write the results there as JSON")
    return parser.parse_args(argv)


SLOTS = {"adam": 2, "sgd": 0}


def width_for(limit_bytes: int, ratio: float, optimizer: str = "adam") -> int:
    """The MLP width whose DEPTH square layers' weights and slots need ratio * limit."""
    params = ratio * limit_bytes / (1 + SLOTS[optimizer]) / 4  # float32
    return max(16, int((params / DEPTH) ** 0.5))


def build(width: int, optimizer: str = "adam"):
    import keras

    inputs = keras.Input((width,))
    h = inputs
    for i in range(DEPTH):
        h = keras.layers.Dense(width, activation="relu", name=f"layer_{i}")(h)
    model = keras.Model(inputs, h)
    model.compile(optimizer=keras.optimizers.Adam(1e-4) if optimizer == "adam"
                  else keras.optimizers.SGD(1e-4), loss="mse")
    return model


def run_case(case: str, limit_mb: int, width: int, steps: int, optimizer: str) -> dict:
    """One case in this process: train `steps` steps, report memory per device."""
    import keras_mgpu_plugins as kmp

    devices = kmp.simulate_devices(2, memory_limit_mb=limit_mb)
    import numpy as np
    import tensorflow as tf

    on_gpu = bool(tf.config.list_logical_devices("GPU"))
    factory = kmp.parallelize(strategy="model_parallel")(build) if case == "placed" else build
    out = {"case": case, "on_gpu": on_gpu, "devices": devices}
    try:
        model = factory(width, optimizer)
        x = np.random.default_rng(0).normal(size=(8 * steps, width)).astype("float32")
        model.fit(x, x, batch_size=8, epochs=1, verbose=0)
        out["trained"] = True
    except (tf.errors.ResourceExhaustedError, tf.errors.InternalError) as err:
        out.update(trained=False, error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
        return out
    if on_gpu:
        out["peak_bytes"] = {d: tf.config.experimental.get_memory_info(d.split("device:")[-1])
                             ["peak"] for d in devices}
    if case == "placed":
        report = kmp.placement_report(model, batch_size=8)
        print(report)
        out["report_bytes"] = {r.device: r.parameter_bytes + r.optimizer_bytes +
                               r.activation_bytes for r in report.rows}
    return out


def child(case: str, args: argparse.Namespace, limit_mb: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--case", case, "--limit-mb",
           str(limit_mb), "--ratio", str(args.ratio), "--steps", str(args.steps),
           "--optimizer", args.optimizer]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")), None)
    if line is None:
        return {"case": case, "trained": False,
                "error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    return json.loads(line[5:])


def backend_of(argv) -> tuple[str, list[str]]:
    """`--backend NAME` (taken out of `argv`), else `KERAS_BACKEND`, else TensorFlow."""
    argv = list(sys.argv[1:] if argv is None else argv)
    picked = argparse.ArgumentParser(add_help=False)
    picked.add_argument("--backend", choices=["tensorflow", "jax"], default=None)
    known, rest = picked.parse_known_args(argv)
    return known.backend or os.environ.get("KERAS_BACKEND") or "tensorflow", rest


def main(argv=None) -> dict:
    backend, argv = backend_of(argv)
    if backend == "jax":  # its own script: no TensorFlow in this process or its children
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import model_parallel_memory_jax

        return model_parallel_memory_jax.main(argv)
    args = parse_args(argv)
    limit_mb = args.limit_mb or (64 if args.quick else 1024)
    width = width_for(limit_mb * 2**20, args.ratio, args.optimizer)
    if args.case:
        print("CASE " + json.dumps(run_case(args.case, limit_mb, width, args.steps,
                                            args.optimizer)))
        return {}
    placed = child("placed", args, limit_mb)  # it says whether there is a GPU
    on_gpu = bool(placed.get("on_gpu"))
    results = {"unplaced": child("unplaced", args, limit_mb)} if on_gpu else {}
    results["placed"] = placed
    limit = limit_mb * 2**20
    need = DEPTH * (width * width + width) * 4 * (1 + SLOTS[args.optimizer])
    print(f"\nMLP {DEPTH} x {width}: parameters + {args.optimizer} slots {need / 2**20:.0f} MiB = "
          f"{need / limit:.2f} x the limit of {limit_mb} MiB per device")
    print(f"{'case':10} {'device':16} {'bytes':>12}  {'of limit':>8}  source")
    for case, res in results.items():
        if not res.get("trained"):
            print(f"{case:10} {'-':16} {'-':>12}  {'-':>8}  did not train: {res.get('error')}")
            continue
        source, per = (("peak", res["peak_bytes"]) if res.get("peak_bytes")
                       else ("placement report", res.get("report_bytes", {})))
        for device, size in per.items():
            print(f"{case:10} {device:16} {size:>12,}  {size / limit:>8.0%}  {source}")
    result = {"limit_bytes": limit, "need_bytes": need, "width": width, "on_gpu": on_gpu,
              "optimizer": args.optimizer,
              "cases": results}
    print("RESULT " + json.dumps(result))
    _suite_report(result, args).finish(args.json)
    return result


def _suite_report(r: dict, args: argparse.Namespace):
    """The results as `benchmarks/_suite.py` writes them."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _suite import Report

    report = Report("model_parallel_memory", "TensorFlow: a model over one device's memory, "
                    "split over two by strategy='model_parallel'", args.quick)
    placed = r["cases"]["placed"]
    per = placed.get("peak_bytes") or placed.get("report_bytes") or {}
    source = "peak bytes in use" if placed.get("peak_bytes") else "kmp.placement_report"
    report.ratio("placed", f"placed: most bytes a device holds / its limit ({source})",
                 max(per.values()) / r["limit_bytes"] if per else None, ("<=", 1.0), [],
                 f"MLP {DEPTH} x {r['width']}, {r['optimizer']}: parameters + slots "
                 f"{r['need_bytes'] / r['limit_bytes']:.2f}x the limit of "
                 f"{r['limit_bytes'] / 2**20:g} MiB, 2 {'GPUs' if r['on_gpu'] else 'CPU devices'}")
    for case, res in r["cases"].items():
        report.row(f"{case}: trained", float(bool(res.get("trained"))), "(1: yes)",
                   res.get("error") or "")
    return report


if __name__ == "__main__":
    main()
