"""What a `WandbLogger` run is told about its job: group, config, batch sizes.

`agreed_group` gives every worker the same W&B group name (one collective);
`job_config` records how the job is distributed and with which versions;
`measured_batch_sizes` reads the batch sizes the replicas really trained on.
"""

from __future__ import annotations

import platform
import secrets
from typing import Any

import keras
import numpy as np

from keras_mgpu_plugins import compat
from keras_mgpu_plugins.integrations._wandb_logic import batch_sizes, format_group_id
from keras_mgpu_plugins.runtime import Runtime


def agreed_group(local: str | None, runtime: Runtime) -> str:
    """This worker's group name if every worker has one, else one drawn by the chief.

    Always one collective, so workers that differ (`KMP_JOB_ID` set on some only)
    never wait for each other in different calls.
    """
    if runtime.agree(bool(local), how="all"):
        return local
    return agree_group_id(runtime)


def agree_group_id(runtime: Runtime) -> str:
    """A group name every worker holds: drawn by the chief, broadcast (a collective)."""
    drawn = secrets.randbits(62) if runtime.is_chief else 0
    return format_group_id(int(runtime.broadcast(np.array([drawn], np.int64))[0]))


def job_config(runtime: Runtime, mode: str) -> dict[str, Any]:
    """How this job is distributed (the runtime's description), and with which versions."""
    from keras_mgpu_plugins import __version__

    config = {
        **runtime.describe(),
        "num_workers": runtime.num_workers,
        "num_replicas": runtime.replicas_in_sync,
        "python_version": platform.python_version(),
        "keras_version": keras.__version__,
        "keras_backend": keras.backend.backend(),
        "keras_mgpu_plugins_version": __version__,
    }
    if mode == "group":
        config["worker_index"] = runtime.worker_index
    return config


def measured_batch_sizes(model: Any, runtime: Runtime, batches_done: int) -> dict[str, int]:
    """Batch sizes from the rows the loss tracker counted on this worker's replicas."""
    counts = compat.loss_tracker_rows(model)
    if counts is None:
        return {}
    return batch_sizes(counts, batches_done, runtime.replicas_in_sync)
