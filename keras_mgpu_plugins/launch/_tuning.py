"""What the launcher adds to the environment of workers that share one host.

- Each worker's TensorFlow thread pools get its share of the host's cores
  (`TF_NUM_INTRAOP_THREADS`, `TF_NUM_INTEROP_THREADS`: the usable cores divided
  by the number of workers, at least 1), as torchrun does with
  `OMP_NUM_THREADS`: otherwise every worker sizes its pools to the whole host
  and the workers' threads fight over the same cores.
- glibc's `top_pad` for TensorFlow's page faults under several workers
  (`compat._env`, a TensorFlow workaround), for every worker.

A variable the user set (in the launcher's environment or `env=`) is left as it is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from keras_mgpu_plugins.compat import _env

THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_tuning(environ: Mapping[str, str], num_workers: int,
                  cpus: int | None = None, min_interop: int = 1) -> dict[str, str]:
    """The variables to add to the environment of `num_workers` local workers.

    `min_interop`: the fewest inter-op threads to give each (a parameter-server worker
    with one waits forever for its first step: `MIN_PARAMETER_SERVER_INTEROP`).
    """
    extra = _env.allocator_environ(environ)
    if num_workers > 1:
        share = max(1, (usable_cpus() if cpus is None else cpus) // num_workers)
        extra.update({name: str(share) for name in THREAD_VARS if name not in environ})
        if "TF_NUM_INTEROP_THREADS" in extra:
            extra["TF_NUM_INTEROP_THREADS"] = str(max(share, min_interop))
    return extra


#: Inter-op threads a worker of a parameter-server cluster needs at least: with one, the
#: first closure it runs never finishes (measured on TensorFlow 2.21, 2 cores: the step
#: waits on the parameter server's variables with the only inter-op thread busy).
MIN_PARAMETER_SERVER_INTEROP = 2
