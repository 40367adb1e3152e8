"""What the launcher adds to the environment of workers that share one host.

- Each worker's thread pools get its share of the host's cores (the usable cores
  divided by the number of local workers, at least 1) on every backend, as torchrun
  does with `OMP_NUM_THREADS`: otherwise every worker sizes its pools to the whole
  host and the workers' threads fight over the same cores (torch on 2 cores, 2
  workers: 3.2x slower than under torchrun, `benchmarks/launch_vs_torchrun.py`).
  `THREAD_VARS` are read by the libraries themselves; torch's inter-op threads have
  no variable: the torch backend sets them from `SHARE_VAR` at the first `fit`
  (`backends.torch.threads`), unless the script set them already.
- glibc's `top_pad` for TensorFlow's page faults under several workers
  (`compat._env`, a TensorFlow workaround), for every worker.

A variable the user set (in the launcher's environment or `env=`), or one that sets
the same pool (`SAME_POOL`), is left as it is and named in the launcher's line
(`threads_line`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from keras_mgpu_plugins.compat import _env

#: Each local worker's share of the cores, and what reads each variable.
THREAD_VARS = {
    "OMP_NUM_THREADS": "OpenMP: torch's intra-op threads, MKL, oneDNN",
    "TF_NUM_INTRAOP_THREADS": "TensorFlow's intra-op pool",
    "TF_NUM_INTEROP_THREADS": "TensorFlow's inter-op pool",
    "PJRT_NPROC": "XLA's CPU client (JAX): its Eigen pool",
}
#: The share itself, for the pools no variable sizes (torch's inter-op threads).
SHARE_VAR = "KMP_WORKER_THREADS"
#: Variables that size the same pool as one of `THREAD_VARS` (XLA reads `PJRT_NPROC`, then
#: `NPROC`; torch reads `MKL_NUM_THREADS` over `OMP_NUM_THREADS`): set, the pool is the user's.
SAME_POOL = {"PJRT_NPROC": ("NPROC",), "OMP_NUM_THREADS": ("MKL_NUM_THREADS",)}


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def share(num_workers: int, cpus: int | None = None) -> int:
    """Threads each of `num_workers` local workers gets: the usable cores // workers, >= 1."""
    return max(1, (usable_cpus() if cpus is None else cpus) // num_workers)


def users_threads(environ: Mapping[str, str]) -> dict[str, str]:
    """The thread settings the user gave (kept, never replaced)."""
    names = [n for name in (*THREAD_VARS, SHARE_VAR) for n in (name, *SAME_POOL.get(name, ()))]
    return {name: environ[name] for name in names if name in environ}


def worker_tuning(environ: Mapping[str, str], num_workers: int,
                  cpus: int | None = None, min_interop: int = 1) -> dict[str, str]:
    """The variables to add to the environment of `num_workers` local workers.

    `min_interop`: the fewest inter-op threads to give each (a parameter-server worker
    with one waits forever for its first step: `MIN_PARAMETER_SERVER_INTEROP`).
    """
    extra = _env.allocator_environ(environ)
    if num_workers > 1:
        each = share(num_workers, cpus)
        mine = users_threads(environ)
        for name in (*THREAD_VARS, SHARE_VAR):
            if not any(n in mine for n in (name, *SAME_POOL.get(name, ()))):
                extra[name] = str(each)
        if "TF_NUM_INTEROP_THREADS" in extra:
            extra["TF_NUM_INTEROP_THREADS"] = str(max(each, min_interop))
    return extra


def threads_line(program: str, environ: Mapping[str, str], extra: Mapping[str, str],
                 num_workers: int, cpus: int | None = None) -> str | None:
    """The launcher's one line on threads: what it set for each worker, what it kept.

    `None` with one worker (it keeps the whole host: nothing set).
    """
    if num_workers < 2:
        return None
    cpus = usable_cpus() if cpus is None else cpus
    set_ = " ".join(f"{n}={extra[n]}" for n in THREAD_VARS if n in extra)
    if SHARE_VAR in extra:
        set_ += f"{' ' if set_ else ''}torch inter-op={extra[SHARE_VAR]}"
    kept = users_threads(environ)
    line = f"{program}: threads of each of {num_workers} workers on {cpus} cores: {set_ or 'none set'}"
    if kept:
        line += "; kept yours: " + " ".join(f"{n}={v}" for n, v in kept.items())
    return line


#: Inter-op threads a worker of a parameter-server cluster needs at least: with one, the
#: first closure it runs never finishes (measured on TensorFlow 2.21, 2 cores: the step
#: waits on the parameter server's variables with the only inter-op thread busy).
MIN_PARAMETER_SERVER_INTEROP = 2
