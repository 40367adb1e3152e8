"""Every way a job starts, as a user starts it: `Start.run(args, workers)` runs
`tests/conformance/job.py` that way and returns what came back (`Run`).

- `one_device`: `python job.py` (the reference: one process, one device);
- `devices`: `python job.py --devices 2` (one process, `kmp.simulate_devices(2)`);
- `kmp_launch`: the `kmp-launch -n 2 job.py` command;
- `kmp_launch_api`: `kmp.launch(job.main, num_workers=2)` from a Python program;
- `runner_slurm`: `python -m keras_mgpu_plugins.run job.py` in 2 plain processes with the
  variables `srun -n 2` sets on one node (what SLURM starts);
- `tf_config`: `python job.py` in 2 plain processes with `TF_CONFIG` set by hand
  (Kubernetes, a hand-made cluster);
- `torchrun`: `torchrun --nproc-per-node 2 job.py` (torch's own launcher).

Where no launcher supervises the processes (the scheduler runner, TF_CONFIG by hand), this
module plays the scheduler: when one process ends badly it waits `GRACE` seconds for the
others to end by themselves (recorded: `Run.ended_alone`), then kills them, as srun's
`--kill-on-bad-exit` or a Kubernetes Job would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "conformance" / "job.py"
TIMEOUT = 240  # a whole run; a hang fails the cell instead of blocking CI
GRACE = 60  # the others' time to fail by themselves once one process failed
_STRIPPED = ("KERAS_DISTRIBUTION_", "TF_CONFIG", "SLURM_", "KMP_", "WORLD_SIZE", "RANK",
             "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "TORCHELASTIC_", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS")
_KEPT = ("KMP_ALLOW_UNCHECKED_VERSIONS",)  # the canary runs the suite on keras-nightly


@dataclasses.dataclass
class Run:
    """What one run of the job gave: exit codes, output, and each worker's results."""

    codes: list[int]
    output: str
    out: pathlib.Path
    seconds: float
    ended_alone: bool = True  # every process ended without the harness killing it

    @property
    def code(self) -> int:
        """The job's exit code as its starter reports it (a launcher's, or the first
        non-zero of plain processes)."""
        return next((c for c in self.codes if c != 0), 0)

    def results(self, phase: str) -> list[dict]:
        """`<phase>-w<rank>.json` of every worker that wrote one, by rank."""
        found = sorted((self.out / "results").glob(f"{phase}-w*.json"),
                       key=lambda p: int(p.stem.rsplit("-w", 1)[1]))
        return [json.loads(p.read_text()) for p in found]


def environment(**extra: str) -> dict[str, str]:
    """The test process's environment without any job's variables, the repository (and
    `extra`'s `PYTHONPATH`, first) on the path, and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED) or k in _KEPT}
    path = [*filter(None, extra.pop("PYTHONPATH", "").split(os.pathsep)), str(ROOT),
            *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(PYTHONPATH=os.pathsep.join(dict.fromkeys(path)), TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="", **extra)
    return env


def free_ports(n: int) -> list[int]:
    """`n` consecutive free ports (SLURM's resolver numbers a node's tasks from a base)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("localhost", 0))
            base = probe.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("localhost", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return list(range(base, base + n))
    raise RuntimeError("no consecutive free ports")


def _supervise(processes: list[subprocess.Popen], logs: list[pathlib.Path], out: pathlib.Path,
               started: float, timeout: float) -> Run:
    """Waits for plain processes as a scheduler would (see the module docstring)."""
    failed_at, ended_alone = None, True
    while any(p.poll() is None for p in processes):
        now = time.monotonic()
        if failed_at is None and any(p.poll() not in (None, 0) for p in processes):
            failed_at = now
        if (failed_at is not None and now - failed_at > GRACE) or now - started > timeout:
            ended_alone = False
            for p in processes:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            for p in processes:
                p.wait()
            break
        time.sleep(0.2)
    output = "".join(f"--- process {i} ---\n{log.read_text(errors='replace')}"
                     for i, log in enumerate(logs))
    return Run([p.returncode for p in processes], output, out, time.monotonic() - started,
               ended_alone)


def _plain(commands: list[list[str]], envs: list[dict[str, str]], out: pathlib.Path,
           timeout: float) -> Run:
    out.mkdir(parents=True, exist_ok=True)
    logs = [out / f"process-{i}.log" for i in range(len(commands))]
    started = time.monotonic()
    processes = []
    for command, env, log in zip(commands, envs, logs, strict=True):
        with open(log, "w") as sink:
            processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink,
                                              stderr=subprocess.STDOUT, start_new_session=True))
    return _supervise(processes, logs, out, started, timeout)


@dataclasses.dataclass(frozen=True)
class Start:
    """One way of starting a job: its name (a column of the table) and how it runs."""

    name: str
    title: str
    workers: int  # how many processes (0: one process on 2 devices)

    def run(self, args: Sequence[str], out: pathlib.Path, workers: int | None = None,
            timeout: float = TIMEOUT, env: dict[str, str] | None = None) -> Run:
        """Runs the job with `args` (its `--out` is `out`); `workers` overrides the count
        (an elastic resume on another number)."""
        n = self.workers if workers is None else workers
        argv = ["--out", str(out), *args]
        extra = dict(env or {})
        if self.name == "one_device":
            return _plain([[sys.executable, str(JOB), *argv]], [environment(**dict(extra))], out,
                          timeout)
        if self.name == "devices":
            return _plain([[sys.executable, str(JOB), "--devices", str(n or 2), *argv]],
                          [environment(**dict(extra))], out, timeout)
        if self.name == "kmp_launch":
            launcher = pathlib.Path(sys.executable).with_name("kmp-launch")
            return _plain([[str(launcher), "-n", str(n), str(JOB), *argv]],
                          [environment(**dict(extra))], out, timeout)
        if self.name == "kmp_launch_api":
            program = ("import sys\nimport keras_mgpu_plugins as kmp\n"
                       "from keras_mgpu_plugins.launch import JobStoppedError, WorkerFailedError\n"
                       "from tests.conformance import job\n"
                       "try:\n"
                       f"    kmp.launch(job.main, num_workers={n}, args=(sys.argv[1:],))\n"
                       "except JobStoppedError as err:\n"
                       "    print(err, file=sys.stderr); sys.exit(err.exit_code)\n"
                       "except WorkerFailedError as err:\n"
                       "    print(err, file=sys.stderr); sys.exit(1)\n")
            return _plain([[sys.executable, "-c", program, *argv]], [environment(**dict(extra))],
                          out, timeout)
        if self.name == "runner_slurm":
            base = free_ports(n)[0]
            common = {"SLURM_NTASKS": str(n), "SLURM_STEP_NUM_TASKS": str(n),
                      "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242",
                      "SLURM_STEP_NODELIST": "localhost",
                      "SLURM_STEP_TASKS_PER_NODE": str(n), "SLURM_JOB_NODELIST": "localhost",
                      "KMP_SLURM_PORT_BASE": str(base), "MASTER_PORT": str(free_ports(1)[0])}
            command = [sys.executable, "-m", "keras_mgpu_plugins.run", str(JOB), *argv]
            return _plain([command] * n,
                          [environment(**common, SLURM_PROCID=str(i), SLURM_LOCALID=str(i),
                                       **dict(extra)) for i in range(n)], out, timeout)
        if self.name == "tf_config":
            cluster = {"worker": [f"localhost:{p}" for p in free_ports(n)]}
            envs = [environment(TF_CONFIG=json.dumps({"cluster": cluster,
                                                      "task": {"type": "worker", "index": i}}),
                                **dict(extra)) for i in range(n)]
            return _plain([[sys.executable, str(JOB), *argv]] * n, envs, out, timeout)
        if self.name == "torchrun":
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                       str(n), "--master-port", str(free_ports(1)[0]), str(JOB), *argv]
            return _plain([command], [environment(OMP_NUM_THREADS="1", **dict(extra))], out, timeout)
        raise ValueError(f"unknown start {self.name!r}")


REFERENCE = Start("one_device", "one process, one device", 1)
STARTS = (
    Start("devices", "2 devices, one process", 0),
    Start("kmp_launch", "kmp-launch -n 2", 2),
    Start("kmp_launch_api", "kmp.launch(fn, num_workers=2)", 2),
    Start("runner_slurm", "srun + python -m keras_mgpu_plugins.run", 2),
    Start("tf_config", "TF_CONFIG by hand", 2),
    Start("torchrun", "torchrun --nproc-per-node 2", 2),
)
BY_NAME = {s.name: s for s in (REFERENCE, *STARTS)}
