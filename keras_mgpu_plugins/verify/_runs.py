"""The runs of a verification, started through kmp's launcher, side by side.

Each run is a launcher job (`launch._common._run`: fresh worker processes, the worker
bootstrap of `kmp-launch`, fail-fast, logs in files) whose processes see `KMP_VERIFY`
(`_config.Config`): the reference run (one process, one device), the noise run (the
same, each training batch's rows reversed; left out when a tolerance is given) and the
parallel run (N simulated devices in one process, or N processes with `processes=True`;
always N processes on torch, which trains one device per process). Their outputs go to
their log files only (`log_dir/<run>/worker-<i>.log`). Each run works in a folder of its own,
`log_dir/<run>/files`, whose entries are links to those of the folder kmp-verify was started
in (`working_folder`): the script reads its files as before, and what a run writes under a
new name there (a checkpoint, a backup, a CSV log) is that run's, never another's, though the
runs are side by side. `start` returns what each process recorded, or the run's failure.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pickle
import re
import threading
from typing import Any

from keras_mgpu_plugins.verify import _config

#: The JAX flag splitting the host into CPU devices (a process of a run with processes has one).
_XLA_COUNT = re.compile(r"--xla_force_host_platform_device_count=\S*")


@dataclasses.dataclass
class Target:
    """What every run runs: a script (or module) with its arguments, or a pickled function."""

    script: str | None = None
    argv: tuple[str, ...] = ()
    module: bool = False
    payload: bytes | None = None

    def spec(self, stall_timeout: float | None, cwd: str | None = None) -> dict[str, Any]:
        """The launcher's spec; with `cwd`, the run's processes work there (paths of this
        process's working folder made absolute first)."""
        import sys

        common = {"num_ps": 0, "create_strategy": True, "stall_timeout": stall_timeout,
                  "cwd": cwd}
        if self.payload is not None:
            return {"mode": "function", "sys_path": [os.path.abspath(p) for p in sys.path],
                    **common}
        target = self.script if self.module else os.path.abspath(self.script)
        return {"mode": "module" if self.module else "script", "target": target,
                "argv": list(self.argv), **common}


def working_folder(path: str, start: str | None = None) -> str:
    """Makes `path` a run's working folder: a link to each entry of `start` (default: this
    process's working folder), but the one that holds `path`. Returns `path`."""
    start = os.path.abspath(start or os.getcwd())
    os.makedirs(path, exist_ok=True)
    inside = os.path.relpath(os.path.abspath(path), start).split(os.sep)[0]
    for name in os.listdir(start):
        if name == inside:  # the logs' own folder, where kmp-verify was told to write them
            continue
        os.symlink(os.path.join(start, name), os.path.join(path, name))
    return path


@dataclasses.dataclass
class RunResult:
    """One run: its records by worker, or its failure (the launcher's error text)."""

    config: _config.Config
    records: dict[int, dict] = dataclasses.field(default_factory=dict)
    failure: str | None = None
    log_dir: str = ""

    @property
    def chief(self) -> dict | None:
        return self.records.get(0)


def plan(num_workers: int, processes: bool, backend: str, noise: bool, steps: int,
         folder: str, seed: int, random_layers: str = "one_device",
         fits: int = 1) -> list[_config.Config]:
    """The runs to start: their configs, in `_config.RUNS` order."""
    one = {"folder": folder, "devices": 1, "workers": 1, "steps": steps, "seed": seed,
           "random_layers": random_layers, "fits": fits}
    runs = [_config.Config(run="reference", **one)]
    if noise:
        runs.append(_config.Config(run="noise", **one))
    if processes or backend == "torch":
        parallel = {**one, "workers": num_workers}
    else:
        parallel = {**one, "devices": num_workers}
    runs.append(_config.Config(run="parallel", **parallel))
    return runs


def environment(config: _config.Config) -> dict[str, str]:
    """The processes' environment: this one's, `KMP_VERIFY`, and with several processes one
    JAX CPU device each (as `kmp-launch -n N` gives)."""
    env = {k: v for k, v in os.environ.items() if k != _config.ENV}
    env[_config.ENV] = config.to_env()
    if config.workers > 1:
        env["JAX_NUM_CPU_DEVICES"] = "1"
        env["XLA_FLAGS"] = _XLA_COUNT.sub("", env.get("XLA_FLAGS", "")).strip()
    return env


def start(target: Target, configs: list[_config.Config], timeout: float | None,
          log_dir: str, stall_timeout: float | None) -> dict[str, RunResult]:
    """Runs every config side by side; returns each run's result by name."""
    results = {c.run: RunResult(c, log_dir=os.path.join(log_dir, c.run)) for c in configs}
    threads = [threading.Thread(target=_one, args=(target, results[c.run], timeout,
                                                   stall_timeout), daemon=True)
               for c in configs]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)  # (a bare join would not see Ctrl-C)
    return results


def _one(target: Target, result: RunResult, timeout: float | None,
         stall_timeout: float | None) -> None:
    from keras_mgpu_plugins.launch._common import _run
    from keras_mgpu_plugins.launch._errors import LaunchError

    config = result.config
    os.makedirs(config.folder, exist_ok=True)
    try:
        cwd = working_folder(os.path.join(result.log_dir, "files"))
        _run(target.spec(stall_timeout, cwd), config.workers, timeout, environment(config),
             target.payload, output="none", log_dir=result.log_dir)
    except LaunchError as err:
        result.failure = str(err)
    except Exception as err:  # noqa: BLE001 - reported as the run's failure
        result.failure = f"{type(err).__name__}: {err}"
    for path in glob.glob(os.path.join(config.folder, f"{config.run}-*.pkl")):
        worker = int(os.path.basename(path)[len(config.run) + 1:-4])
        with open(path, "rb") as f:
            result.records[worker] = pickle.load(f)
