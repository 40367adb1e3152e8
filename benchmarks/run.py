"""Every benchmark in one command: each script run in its own process, one table of ratios.

    python benchmarks/run.py                  # full mode: every benchmark, ~1.5-2 h on 2 CPU cores
    python benchmarks/run.py --rounds 3       # fewer alternations of each comparison
    python benchmarks/run.py --quick          # CI: seconds each, shows that each runs (values mean nothing)
    python benchmarks/run.py --only loop callbacks_jax
    python benchmarks/run.py --save           # also into benchmarks/results/, then:
    python benchmarks/run.py --update-docs    # docs/benchmarks.md's figures from benchmarks/results/

Each benchmark (`BENCHMARKS`) is a script of this folder run with `KERAS_BACKEND` set, this
tree first on `PYTHONPATH`, and `--json` (and `--quick`, `--rounds`): it writes its ratios,
each with its goal, and its other figures. The interpreter of a backend is `--python
BACKEND=PATH`, else (full mode) the repository's CI environment of that lane
(`.ci-venv`: TensorFlow, `.ci-venv-jax`, `.ci-venv-torch`) where it exists, else this one:
one command measures every lane. A benchmark whose modules no interpreter has is skipped,
by name (what the quick suite of each CI lane does with the other lanes' benchmarks).
Exit status 1 if a benchmark failed, timed out, or did not report each of its ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _suite import format_goal, format_ratio  # noqa: E402

#: The CI environment of each lane (`.ci/run`), where the full mode looks for an interpreter.
LANE_VENVS = {"tensorflow": ".ci-venv", "jax": ".ci-venv-jax", "torch": ".ci-venv-torch"}


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One run of a script: its key (the JSON's name), the script, the Keras backend it runs
    under, the modules it needs, its extra arguments, the ratios it must report, whether the
    quick suite (CI) runs it, how long it may take (full mode; --quick: a tenth), and whether
    it alternates sides in rounds (takes `--rounds`)."""

    key: str
    script: str
    backend: str
    needs: tuple[str, ...]
    args: tuple[str, ...] = ()
    expects: tuple[str, ...] = ()
    quick: bool = True
    timeout: int = 3600
    rounds: bool = True


def _b(key: str, script: str, backend: str, expects: tuple[str, ...] = (), args: tuple = (),
       needs: tuple[str, ...] | None = None, quick: bool = True, timeout: int = 3600,
       rounds: bool | None = None) -> Benchmark:
    takes = script not in NO_ROUNDS if rounds is None else rounds
    return Benchmark(key, script, backend, needs or (backend,), tuple(args), expects, quick,
                     timeout, takes)


#: The scripts that repeat without alternating sides in rounds: no `--rounds`.
NO_ROUNDS = ("checkpoint_async.py", "device_metrics_mfu_overhead.py",
             "device_metrics_overhead.py", "parameter_server.py",
             "stall_watchdog_overhead.py", "weight_sync_fingerprint.py", "first_step.py",
             "model_parallel_memory.py", "model_parallel_memory_jax.py", "preemption.py")


BENCHMARKS = (
    _b("loop", "workers_vs_loop.py", "tensorflow", ("loop_spe16", "loop_spe1")),
    _b("parallelize", "parallelize_overhead.py", "tensorflow", ("parallelize",)),
    _b("callbacks_tensorflow", "callbacks_overhead.py", "tensorflow", ("all", "stop_signals")),
    _b("callbacks_jax", "callbacks_overhead.py", "jax", ("all", "stop_signals")),
    _b("callbacks_torch", "callbacks_overhead.py", "torch", ("all", "stop_signals")),
    _b("jax_devices", "jax_vs_keras.py", "jax", ("devices_spe16", "devices_spe1"),
       ("--only", "devices")),
    _b("jax_processes", "jax_vs_keras.py", "jax", ("processes_spe16", "processes_spe1"),
       ("--only", "processes")),
    _b("jax_vs_tf", "jax_vs_keras.py", "tensorflow", ("backends_spe16", "backends_spe1"),
       ("--only", "backends"), needs=("jax", "tensorflow")),
    _b("torch_vs_ddp", "torch_vs_ddp.py", "torch", ("loop",)),
    _b("launch_vs_torchrun", "launch_vs_torchrun.py", "torch", ("torchrun_wall_s", "torchrun_fit_s")),
    _b("workers", "workers_throughput.py", "tensorflow", ("workers_spe16", "workers_spe1")),
    _b("fingerprint", "weight_sync_fingerprint.py", "tensorflow", ("throughput", "overhead")),
    _b("checkpoint", "checkpoint_async.py", "tensorflow", ("async",)),
    _b("device_metrics", "device_metrics_overhead.py", "tensorflow", ("logger",)),
    _b("device_metrics_jax", "device_metrics_overhead.py", "jax", ("logger",)),
    _b("device_metrics_torch", "device_metrics_overhead.py", "torch", ("logger",)),
    _b("device_metrics_parts", "device_metrics_mfu_overhead.py", "tensorflow", ("parts",)),
    _b("device_metrics_parts_jax", "device_metrics_mfu_overhead.py", "jax", ("parts",)),
    _b("device_metrics_parts_torch", "device_metrics_mfu_overhead.py", "torch", ("parts",)),
    _b("stall_watchdog", "stall_watchdog_overhead.py", "tensorflow", ("watchdog",)),
    _b("parameter_server", "parameter_server.py", "tensorflow", ("ps_2_workers",)),
    _b("model_parallel_memory", "model_parallel_memory.py", "tensorflow", ("placed",)),
    _b("model_parallel_memory_jax", "model_parallel_memory_jax.py", "jax",
       ("sharded_vs_one_device",)),
    _b("first_step", "first_step.py", "tensorflow"),
    _b("uneven_batches", "uneven_batches.py", "tensorflow", ("even", "uneven")),
    # benchmarks/preemption.py belongs to the stop-signal work (issue 40 point 2); it joins
    # the quick suite once it takes --quick and --json (quick=False until then).
    _b("preemption", "preemption.py", "tensorflow", quick=False),
)


def _has_modules(python: str, modules: tuple[str, ...], cache: dict) -> bool:
    key = (python, modules)
    if key not in cache:
        check = ("import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None "
                 f"for m in {list(modules)!r}))")
        cache[key] = subprocess.run([python, "-c", check], capture_output=True).returncode == 0
    return cache[key]


def interpreter(bench: Benchmark, given: dict[str, str], quick: bool, cache: dict) -> str | None:
    """The Python that runs `bench` (see the module docstring), or `None`: no interpreter has
    its modules."""
    candidates = [given[bench.backend]] if bench.backend in given else []
    if not quick:
        venv = os.path.join(ROOT, LANE_VENVS[bench.backend], "bin", "python")
        candidates += [venv] if os.path.exists(venv) else []
    candidates.append(sys.executable)
    return next((p for p in candidates if _has_modules(p, bench.needs, cache)), None)


def run_one(bench: Benchmark, python: str, out: str, quick: bool, rounds: int | None) -> dict:
    """Runs `bench`; its JSON, or `{"error": ...}` where it failed or reported too little."""
    path, log = os.path.join(out, f"{bench.key}.json"), os.path.join(out, f"{bench.key}.log")
    command = [python, os.path.join(HERE, bench.script), *bench.args, "--json", path]
    command += ["--quick"] if quick else []
    command += ["--rounds", str(rounds)] if rounds and not quick and bench.rounds else []
    env = dict(os.environ, KERAS_BACKEND=bench.backend, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    timeout = bench.timeout // 10 if quick else bench.timeout
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        try:
            code = subprocess.run(command, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout} s"
    seconds = time.perf_counter() - start
    if code != 0 or not os.path.exists(path):
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        return {"error": f"exit {code}" if code else "no JSON written", "log": tail,
                "seconds": seconds}
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    missing = [k for k in bench.expects if k not in {r["key"] for r in result["ratios"]}
               or next(r for r in result["ratios"] if r["key"] == k)["value"] is None]
    if missing:
        return {"error": f"ratios not reported: {', '.join(missing)}", "log": "",
                "seconds": seconds}
    result["wall_s"] = round(seconds, 1)
    return result


def table(results: dict[str, dict]) -> str:
    """One table of every ratio, each with its goal and whether it is met."""
    lines = [f"{'ratio':<78} {'value':>8}  {'goal':<7} {'met':<4} rounds"]
    for key, result in results.items():
        if "skipped" in result or "error" in result:
            lines.append(f"{key}: {result.get('skipped') or 'FAILED: ' + result['error']}")
            continue
        load = result["machine"]["load_average"]
        lines.append(f"{key} ({result['wall_s']:.0f} s, load average {load[0]}-{load[1]})")
        for r in result["ratios"]:
            met = {True: "yes", False: "NO", None: "-"}[r["met"]]
            rounds = ", ".join(f"{x:.2f}" for x in r["rounds"])
            lines.append(f"  {r['name'][:76]:<76} {format_ratio(r['value']):>8}  "
                         f"{format_goal(r['goal']):<7} {met:<4} {rounds}".rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    keys = [b.key for b in BENCHMARKS]
    parser.add_argument("--quick", action="store_true", help="the CI suite: seconds each")
    parser.add_argument("--rounds", type=int, help="rounds of each comparison (full mode)")
    parser.add_argument("--only", nargs="+", choices=keys, metavar="KEY", help=f"some of {keys}")
    parser.add_argument("--skip", nargs="+", choices=keys, default=[], metavar="KEY")
    parser.add_argument("--python", action="append", default=[], metavar="BACKEND=PATH",
                        help="the interpreter of a backend's benchmarks (repeatable)")
    parser.add_argument("--out", help="folder for each benchmark's JSON and log (default: a temp one)")
    parser.add_argument("--save", action="store_true", help="copy the JSON to benchmarks/results/")
    parser.add_argument("--update-docs", action="store_true",
                        help="only render benchmarks/results/*.json into docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.update_docs:
        import _docs

        _docs.update_file()
        return 0
    if args.save and args.quick:
        parser.error("--save keeps measurements: not with --quick")
    given = dict(item.split("=", 1) for item in args.python)
    out = args.out or tempfile.mkdtemp(prefix="kmp-benchmarks-")
    os.makedirs(out, exist_ok=True)
    chosen = [b for b in BENCHMARKS if (not args.only or b.key in args.only)
              and b.key not in args.skip and (b.quick or not args.quick or args.only)]
    results: dict[str, dict] = {}
    cache: dict = {}
    started = time.perf_counter()
    for bench in chosen:
        python = interpreter(bench, given, args.quick, cache)
        if python is None:
            results[bench.key] = {"skipped": f"skipped: needs {' and '.join(bench.needs)}, "
                                             "not installed here"}
            print(f"{bench.key}: {results[bench.key]['skipped']}", file=sys.stderr, flush=True)
            continue
        print(f"{bench.key}: benchmarks/{bench.script} {' '.join(bench.args)} ({python})",
              file=sys.stderr, flush=True)
        results[bench.key] = run_one(bench, python, out, args.quick, args.rounds)
        if "error" in results[bench.key]:
            print(results[bench.key]["log"], file=sys.stderr)
        elif args.save:
            os.makedirs(RESULTS, exist_ok=True)
            shutil.copy(os.path.join(out, f"{bench.key}.json"), RESULTS)
    total = time.perf_counter() - started
    print(f"\n{'--quick (values not meaningful), ' if args.quick else ''}{len(chosen)} "
          f"benchmarks, {total:.0f} s; JSON and logs in {out}\n")
    print(table(results))
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"quick": args.quick, "seconds": round(total, 1), "results": results}, f, indent=1)
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
