"""`kmp-verify -n 2` on `examples/quickstart.py --quick` on the GPU machine (JAX lane).

What is meaningful with one GPU: kmp-verify's parallel run needs N devices, and one GPU
gives neither N JAX devices (JAX cannot split a GPU into logical devices as TensorFlow
does: `kmp.simulate_devices` puts JAX on CPU devices) nor N processes (NCCL, JAX's and
torch's collectives on GPUs, refuses two ranks on one GPU). So the part runs two
verifications side by side, each `python -m keras_mgpu_plugins.verify -n 2 --steps K
--json ...`:

- `gpu_against_cpu` (`verify_quickstart.py`): the one-device runs (reference and noise)
  train on the GPU, the parallel run on 2 CPU devices, float32 at full matmul precision
  (`JAX_DEFAULT_MATMUL_PRECISION=highest`: no TF32). It tells whether kmp on 2 devices
  trains as the GPU trains the quickstart, within the GPU's own float noise; a DIFFER
  here may be the two platforms' rounding (the noise run measures the GPU's alone), so its
  verdict is recorded, not held to EQUAL;
- `quickstart`: the quickstart as a user runs kmp-verify on this machine: the quickstart's
  `kmp.simulate_devices` puts every run on CPU devices (one GPU cannot be split on JAX):
  its verdict must be EQUAL, as on any CPU.

Each records the verdict (EQUAL, DIFFER with the first step, the variables and causes,
CANNOT COMPARE with the reasons), the table's rows, the devices each run trained on (from
the runs' logs) and the time. The one-device runs share the GPU side by side:
`XLA_PYTHON_CLIENT_PREALLOCATE=false`, else the first takes 75% of its memory.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import common
from part_tests import ROOT

SIZES = {"gpu": {"steps": 16, "timeout": 150}, "cpu": {"steps": 8, "timeout": 200}}
KEPT = ("verdict", "reasons", "backend", "steps", "rows", "first_step", "first_what",
        "top_variables", "causes", "notes", "seconds")


def run(rec: common.Recorder, size: dict) -> None:
    dry_run = os.environ.get("KMP_GPU_DRY_RUN") == "1"
    cases = (
        ("gpu_against_cpu", "benchmarks/gpu/verify_quickstart.py", False,
         {"KMP_GPU_VERIFY_PLATFORM": "cpu" if dry_run else "cuda",
          "JAX_DEFAULT_MATMUL_PRECISION": "highest"}),
        ("quickstart", "examples/quickstart.py", True, {}),
    )
    with tempfile.TemporaryDirectory(prefix="kmp-gpu-verify-") as folder:
        # Both verifications side by side (6 processes; the machine has 16 cores): the
        # part's time is the longer one's, not their sum.
        started = {name: start(script, size, env, os.path.join(folder, name))
                   for name, script, _, env in cases}
        for name, _, must_equal, _ in cases:
            with rec.step(name) as step:
                found = finish(*started[name])
                rec.put(**{name: found})
                if found["exit_code"] not in (0, 1) or found.get("verdict") is None:
                    step.update(status="failed", message=f"kmp-verify exit code "
                                f"{found['exit_code']}: {found['output'][-1500:]}")
                elif must_equal and found["verdict"] != "equal":
                    step.update(status="failed", message=f"{found['verdict']}: "
                                f"{found['output'][-1500:]}")


def start(script: str, size: dict, env: dict[str, str], folder: str) -> tuple:
    """Starts `kmp-verify -n 2 --steps K` of `script --quick`, its report and logs in `folder`."""
    os.makedirs(folder)
    cmd = [sys.executable, "-m", "keras_mgpu_plugins.verify", "-n", "2", "--steps",
           str(size["steps"]), "--timeout", str(size["timeout"]), "--json",
           os.path.join(folder, "report.json"), "--log-dir", os.path.join(folder, "logs"),
           script, "--quick"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace",
                            env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", **env})
    return proc, cmd, env, folder, time.perf_counter()


def finish(proc: subprocess.Popen, cmd: list[str], env: dict[str, str], folder: str,
           started: float) -> dict:
    """What a started verification gave: its report (JSON), output, devices, time."""
    output = proc.communicate()[0]
    seconds = time.perf_counter() - started
    common.log(output)
    found: dict = {"command": " ".join(["python", *cmd[1:]]).replace(folder, "TMP"),
                   "environment": env, "exit_code": proc.returncode,
                   "wall_seconds": seconds, "output": output[-4000:]}
    report = os.path.join(folder, "report.json")
    if os.path.exists(report):
        with open(report) as f:
            data = json.load(f)
        found.update({key: data.get(key) for key in KEPT})
    found["devices"] = trained_on(os.path.join(folder, "logs"))
    return found


def trained_on(logs: str) -> dict[str, list[str]]:
    """Each run's `kmp-gpu-verify: ...` line (verify_quickstart.py prints it), by log file."""
    lines: dict[str, list[str]] = {}
    for path in sorted(glob.glob(os.path.join(logs, "**", "*.log"), recursive=True)):
        with open(path, errors="replace") as f:
            found = [line.strip() for line in f if line.startswith("kmp-gpu-verify:")]
        if found:
            lines[os.path.relpath(path, logs)] = found
    return lines
