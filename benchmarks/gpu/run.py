"""The GPU run: every GPU path of kmp measured in one call, each part in a process of its own.

    python benchmarks/gpu/run.py [--out DIR] [--only PART ...]     # on the GPU machine
    python benchmarks/gpu/run.py --cpu-dry-run --out DIR            # the same code, CPU, tiny
    python benchmarks/gpu/run.py --check DIR/gpu-cpu.json           # every part has a status
    python benchmarks/gpu/run.py --cpu-dry-run --python torch=PATH  # one part's interpreter

(`benchmarks/gpu/run.sh` installs the carried wheels first, then runs this.) Each part
(`PARTS`) runs as `part.py NAME` in a fresh process of this interpreter (of `--python
PART=PATH` for that part: the GPU machine has one for JAX and torch, a dry run here can give
the `torch` part the torch lane's) with its own time budget: over it,
the part's process group is killed and the part is recorded as `timed_out` with what it
had measured; a failing part is recorded with its message; either way the run goes on.
After every part, `OUT/gpu-<device>.json` is rewritten (`<device>`: `h200` from
nvidia-smi's name, `cpu` in a dry run), and every line the parts print goes to
`OUT/gpu-<device>.log` too. `OUT` is `--out`, else `$OUT` (the device tool's folder),
else `benchmarks/gpu/out`. This process imports neither JAX nor Keras: a JAX here would
take the GPU's memory from the parts.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import smi  # noqa: E402 - this folder, put on sys.path above

SCHEMA = "kmp-gpu-run/1"
#: (name, budget on the GPU s, budget in a dry run s, what it measures). The GPU budgets
#: add up to TOTAL_S: the whole run, JAX's compilations included, in 8 minutes. The dry
#: run's are only a guard against a hang (a loaded CI machine compiles slowly).
PARTS = (
    ("ceilings", 20, 90, "bf16 matmul rate and device-to-device copy, in this run; devices, nvidia-smi"),
    ("tests", 55, 240, "the JAX lane's tests marked gpu (tests/gpu), on the real device"),
    ("throughput", 175, 300, "ResNet-style CNN and small transformer, bf16: kmp + all callbacks "
                            "vs plain Keras-JAX (goal >= 0.99); model FLOPs utilisation"),
    ("checkpoint", 50, 120, "a >= 1 GB model: training blocked per save, sync vs async_save=True "
                           "vs keras.callbacks.OrbaxCheckpoint(save_on_background=True)"),
    ("fingerprint", 20, 90, "WeightSyncVerifier's fingerprints vs a device-to-device copy"),
    ("memory", 40, 240, "model_parallel's ModelTooLargeError against the real bytes_limit; "
                        "model_parallel_memory_jax.py's GPU path (peak_bytes_in_use)"),
    ("metrics", 15, 120, "DeviceMetricsLogger's keys of a short fit: FLOPs, MFU, phases, "
                         "stragglers where landed ('not landed' for the others)"),
    ("stop_signals", 15, 120, "BackupAndRestore() (stop signals watched) vs a plain fit and vs "
                              "stop_signals=None, per step, one process"),
    ("verify", 30, 240, "kmp-verify -n 2 on examples/quickstart.py: the GPU's one device against "
                        "2 CPU devices, and as a user runs it here; verdict and time"),
    ("torch", 55, 240, "the torch lane (KERAS_BACKEND=torch): its tests marked gpu, kmp + all "
                       "callbacks vs plain Keras-torch (bf16), vs Keras's own DDP fit where "
                       "installed"),
)
TOTAL_S = 475
STATUSES = ("ok", "failed", "timed_out", "skipped", "not_run")
VERSIONS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
            "keras", "numpy", "ml-dtypes", "optree", "namex", "h5py", "orbax-checkpoint",
            "nvidia-ml-py", "torch", "pytest", "cloudpickle", "psutil")


def versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (nothing imported)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    scope: dict[str, str] = {}
    with open(os.path.join(ROOT, "keras_mgpu_plugins", "_version.py")) as f:
        exec(f.read(), scope)  # noqa: S102 - our own one-line file
    found["keras_mgpu_plugins"] = scope.get("__version__")
    return found


def commit() -> str | None:
    """The commit the tree was at, where git can tell (the device's copy may have no .git)."""
    if os.environ.get("KMP_GPU_COMMIT"):
        return os.environ["KMP_GPU_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def skeleton(dry_run: bool, device: str, argv: list[str]) -> dict[str, Any]:
    budgets = {name: dry if dry_run else gpu for name, gpu, dry, _ in PARTS}
    return {
        "schema": SCHEMA, "mode": "cpu-dry-run" if dry_run else "gpu", "device": device,
        "date": now(), "finished": None, "seconds": None,
        "command": os.environ.get("KMP_GPU_COMMAND") or " ".join(["python", *argv]),
        "commit": commit(), "versions": versions(),
        "machine": {"platform": platform.platform(), "cpu_cores": os.cpu_count()},
        "budget_s": None if dry_run else TOTAL_S,
        "parts": {name: {"status": "not_run", "budget_s": budgets[name], "what": what}
                  for name, _, _, what in PARTS},
    }


def write(run: dict[str, Any], path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(run, f, indent=1)
    os.replace(tmp, path)


def part_command(name: str, result: str, dry_run: bool, python: str | None = None) -> list[str]:
    """The part's command: `python` (default: this interpreter) running `part.py NAME`."""
    return [python or sys.executable, os.path.join(HERE, "part.py"), name, "--result", result,
            *(["--cpu-dry-run"] if dry_run else [])]


def interpreters(pairs: list[str]) -> dict[str, str]:
    """`--python PART=PATH` pairs as `{part: path}` (the GPU machine has one interpreter for
    every part; a dry run here can give the torch part the torch lane's environment)."""
    names = [name for name, *_ in PARTS]
    found = {}
    for pair in pairs:
        name, _, path = pair.partition("=")
        if name not in names or not path:
            raise ValueError(f"--python takes PART=PATH with PART one of {names}. "
                             f"Received: --python {pair!r}")
        found[name] = path
    return found


def part_env(name: str, dry_run: bool, run_json: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["KERAS_BACKEND"] = "torch" if name == "torch" else "jax"
    env["KMP_GPU_RUN_JSON"] = run_json
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if dry_run:
        env["JAX_PLATFORMS"] = "cpu"
        env["KMP_GPU_DRY_RUN"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_part(cmd: list[str], env: dict[str, str], budget: float, log) -> tuple[str, int | None, float]:
    """Runs `cmd` in its own process group, its output copied to `log` and stdout.

    Returns:
        `("ok" | "failed" | "timed_out", exit code or None, seconds)`; over `budget`
        seconds the whole group is sent SIGTERM, then SIGKILL 5 s later.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)

    def copy() -> None:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
            log.flush()

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=budget)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        status = "timed_out"
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
    reader.join(timeout=10)
    return status, (None if status == "timed_out" else proc.returncode), time.perf_counter() - start


def record_part(entry: dict[str, Any], status: str, code: int | None, seconds: float,
                result_path: str) -> None:
    """What part.py left in `result_path`, merged into the run's `entry` for the part."""
    found: dict[str, Any] = {}
    if os.path.exists(result_path):
        try:
            with open(result_path) as f:
                found = json.load(f)
        except ValueError as err:
            found = {"result": {}, "steps": {}, "unreadable": str(err)}
    entry.update(seconds=round(seconds, 1), exit_code=code, result=found.get("result", {}),
                 steps=found.get("steps", {}))
    failed = [f"{n}: {s.get('message', s.get('status'))}" for n, s in entry["steps"].items()
              if s.get("status") not in ("ok", "skipped")]
    if status == "ok" and found.get("skipped"):
        entry.update(status="skipped", message=found["skipped"])
    elif status == "timed_out":
        entry.update(status="timed_out", message=f"over its budget of {entry['budget_s']} s; "
                     f"steps failed or not finished: {failed or 'none started'}")
    elif status == "failed" or failed:
        entry.update(status="failed", message="; ".join(failed)[:4000]
                     or f"exit code {code} (see the log)")
    else:
        entry.update(status="ok")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="the same parts on CPU with tiny sizes (CI)")
    parser.add_argument("--out", help="folder for gpu-<device>.json and .log (default $OUT)")
    parser.add_argument("--only", nargs="+", choices=[p[0] for p in PARTS])
    parser.add_argument("--check", metavar="JSON", help="only check a run's JSON, and exit")
    parser.add_argument("--python", action="append", default=[], metavar="PART=PATH",
                        help="the interpreter of one part (default: this one), e.g. "
                             "torch=.ci-venv-torch/bin/python; may be repeated")
    args = parser.parse_args(argv)
    try:
        pythons = interpreters(args.python)
    except ValueError as err:
        parser.error(str(err))
    if args.check:
        problems = check(args.check)
        print("\n".join(problems) or f"{args.check}: every part has a status, none failed")
        return 1 if problems else 0
    out = args.out or os.environ.get("OUT") or os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)
    device = smi.device_slug(args.cpu_dry_run)
    path = os.path.join(out, f"gpu-{device}.json")
    run = skeleton(args.cpu_dry_run, device, ["benchmarks/gpu/run.py", *argv])
    started = time.perf_counter()
    write(run, path)
    with open(os.path.join(out, f"gpu-{device}.log"), "a") as log:
        for name, *_ in PARTS:
            entry = run["parts"][name]
            if args.only and name not in args.only:
                entry.update(status="skipped", message="not asked for (--only)")
                continue
            left = TOTAL_S - (time.perf_counter() - started)
            if not args.cpu_dry_run and left < 10:
                entry["message"] = "the run's time was spent before this part"
                continue
            budget = entry["budget_s"] if args.cpu_dry_run else min(entry["budget_s"], left)
            result_path = os.path.join(out, f".part-{name}.json")
            cmd = part_command(name, result_path, args.cpu_dry_run, pythons.get(name))
            entry.update(command=" ".join(["python", os.path.relpath(cmd[1], ROOT), *cmd[2:3],
                                           *(["--cpu-dry-run"] if args.cpu_dry_run else [])]),
                         python=cmd[0], started=now())
            log.write(f"\n===== {name} ({budget:.0f} s) {entry['started']}\n")
            print(f"\n===== part {name} (budget {budget:.0f} s)", flush=True)
            status, code, seconds = run_part(cmd, part_env(name, args.cpu_dry_run, path),
                                             budget, log)
            record_part(entry, status, code, seconds, result_path)
            if os.path.exists(result_path):
                os.remove(result_path)
            run["seconds"] = round(time.perf_counter() - started, 1)
            write(run, path)
    run.update(finished=now(), seconds=round(time.perf_counter() - started, 1))
    write(run, path)
    print(summary(run, path))
    return 1 if check(path) else 0


def summary(run: dict[str, Any], path: str) -> str:
    lines = [f"\n{run['mode']} run on {run['device']}, {run['seconds']} s -> {path}"]
    for name, entry in run["parts"].items():
        lines.append(f"  {name:12} {entry['status']:10} {entry.get('seconds', '-'):>6} s  "
                     f"{(entry.get('message') or '')[:150]}")
    return "\n".join(lines)


def check(path: str) -> list[str]:
    """What is wrong with a run's JSON: a part missing, without a known status, or not
    `ok`/`skipped` (a failure or a timeout, with its message)."""
    with open(path) as f:
        run = json.load(f)
    problems = [] if run.get("schema") == SCHEMA else [f"schema {run.get('schema')!r}, not {SCHEMA!r}"]
    for name, *_ in PARTS:
        entry = run.get("parts", {}).get(name)
        if entry is None or entry.get("status") not in STATUSES:
            problems.append(f"part {name}: no status ({entry!r:.200})")
        elif entry["status"] not in ("ok", "skipped"):
            problems.append(f"part {name}: {entry['status']}: {entry.get('message', '')[:1000]}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
