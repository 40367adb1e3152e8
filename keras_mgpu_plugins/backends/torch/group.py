"""Joining the job's torch process group: from torchrun's variables, `kmp-launch`, SLURM or
`KERAS_DISTRIBUTION_*`, before any user code where kmp starts the process.

`initialize()` finds the job (`cluster.processes.planned_processes`), sets torch's own
variables where the launcher did not (`WORLD_SIZE`, `RANK`, `LOCAL_RANK`,
`LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`: a script written for torchrun reads
them under `kmp-launch` or `srun` too), picks this process's GPU (`LOCAL_RANK`; NCCL) or
the CPU (gloo; on a local job, over the loopback interface only), and starts the default
process group with `init_method="env://"` (under torchrun that joins the store its agent
already holds; a local job `kmp-launch` started keeps its store in a file of its private
job folder instead: torch's TCP store listens on every interface). Idempotent; a group the script or Keras started (`keras.distribution.
initialize`) is used as it is.
"""

from __future__ import annotations

import datetime
import os

from keras_mgpu_plugins.cluster import world
from keras_mgpu_plugins.cluster.processes import Plan, planned_processes

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Seconds a collective may wait for a process (`KMP_TORCH_TIMEOUT`; torch's default: 1800).
TIMEOUT_ENV = "KMP_TORCH_TIMEOUT"


def initialize(plan: Plan | None = None) -> bool:
    """Starts the default process group for the job the environment describes. Idempotent.

    Returns:
        Whether this process is one of several (the group exists, with several processes).
    """
    import torch
    import torch.distributed as dist

    from keras_mgpu_plugins.compat import check_keras_for_distribution

    if dist.is_available() and dist.is_initialized():
        several = dist.get_world_size() > 1
        if several:
            check_keras_for_distribution()
            _install_worker_checks()
        return several
    plan = plan or planned_processes()
    if plan is None:
        return False
    check_keras_for_distribution()  # the version policy of every lane, before Keras's code
    for name, value in _variables(plan).items():
        os.environ.setdefault(name, value)
    local = int(os.environ[world.LOCAL_RANK])
    if torch.cuda.is_available():
        torch.cuda.set_device(local % torch.cuda.device_count())
        backend = "nccl"
    else:
        backend = "gloo"
        if os.environ[world.MASTER_ADDR] in _LOCAL_HOSTS:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback())
    timeout = float(os.environ.get(TIMEOUT_ENV, "1800"))
    method = _init_method(plan)
    ranks = ({} if method == "env://" else
             {"rank": int(os.environ[world.RANK]), "world_size": int(os.environ[world.WORLD_SIZE])})
    dist.init_process_group(backend, init_method=method,
                            timeout=datetime.timedelta(seconds=timeout), **ranks)
    _install_worker_checks()
    return dist.get_world_size() > 1


def _variables(plan: Plan) -> dict[str, str]:
    """torch's variables for `plan` (this process's place on its host from the cluster)."""
    local = world.local_rank(os.environ)
    local_count = plan.num_processes
    from keras_mgpu_plugins.cluster.topology import topology_from_env

    cluster = topology_from_env(os.environ).cluster_spec
    addresses = tuple(cluster.get("chief", ())) + tuple(cluster.get("worker", ())) if cluster \
        else ()
    if len(addresses) == plan.num_processes:
        position, local_count = world.local_position(addresses, plan.process_id)
        local = position if local is None else local
    host = plan.coordinator_address.rpartition(":")[0]
    address = (f"127.0.0.1:{plan.coordinator_address.rpartition(':')[2]}"
               if host in _LOCAL_HOSTS else plan.coordinator_address)
    return world.variables_for(address, plan.num_processes, plan.process_id,
                               0 if local is None else local, local_count)


def _init_method(plan: Plan) -> str:
    """`env://` (torch's store on `MASTER_ADDR:MASTER_PORT`, torchrun's agent's under torchrun),
    except for a local job kmp launched: a file store in the job's private folder, so no
    process listens on a port of every interface (torch's TCP store binds them all)."""
    job_dir = os.environ.get("KMP_JOB_DIR")
    if job_dir and plan.source == "tf_config" and os.environ[world.MASTER_ADDR] in _LOCAL_HOSTS:
        return f"file://{os.path.join(job_dir, 'torch-store-' + os.environ[world.MASTER_PORT])}"
    return "env://"


def _loopback() -> str:
    """The name of the loopback interface (`lo` on Linux, `lo0` on macOS)."""
    try:
        names = [name for _, name in __import__("socket").if_nameindex()]
    except OSError:
        return "lo"
    return next((n for n in names if n.startswith("lo")), "lo")


def _install_worker_checks() -> None:
    """Once this process is one of several: progress bars on the chief only, every `fit`
    checks its kmp callbacks against the other processes', and `fit` of a model that would
    train apart is refused (`torch_one_model_per_job`). Idempotent."""
    from keras_mgpu_plugins import _same_callbacks, _worker_output
    from keras_mgpu_plugins.compat import _registry

    _worker_output.install()
    _same_callbacks.install()
    _registry.apply("torch_one_model_per_job")
