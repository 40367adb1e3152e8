"""Functions the torch launch tests run in each process (importable: they travel by reference)."""

from __future__ import annotations

import os
import subprocess


def who_and_what_listens() -> dict:
    """The process group as the launcher's bootstrap left it, torch's variables, the sockets
    this process listens on."""
    import torch.distributed as dist

    from keras_mgpu_plugins import runtime

    run = runtime.of()
    run.barrier()  # every process has its sockets up
    out = subprocess.run(["ss", "-ltnH", "-p"], capture_output=True, text=True).stdout
    listening = [line.split()[3] for line in out.splitlines() if f"pid={os.getpid()}," in line]
    run.barrier()
    return {"rank": [dist.is_initialized(), dist.get_rank(), dist.get_world_size()],
            "variables": {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK")},
            "listening": listening}


def own_group(port: int) -> dict:
    """The script starts its process group itself, from its own arguments (no variables)."""
    import datetime

    import torch.distributed as dist

    rank, count = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=count, timeout=datetime.timedelta(seconds=60))
    import keras  # noqa: F401 - Keras imported: kmp asks the backend

    import keras_mgpu_plugins as kmp

    topology = kmp.topology()
    found = {"topology": [topology.worker_index, topology.num_workers, topology.is_chief,
                          topology.source], "rank": list(kmp.runtime.of().rank())}
    kmp.runtime.of().barrier()
    dist.destroy_process_group()
    return found


def fail_on_rank_one() -> str:
    """Rank 1 raises; rank 0 waits for it in a collective, forever unless stopped."""
    import numpy as np

    from keras_mgpu_plugins import runtime

    run = runtime.of()
    if run.rank().worker_index == 1:
        raise ValueError("rank one broke on purpose")
    run.all_gather(np.ones(1))
    return "rank 0 went on"
