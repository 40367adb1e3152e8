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

from keras_mgpu_plugins import collective, compat
from keras_mgpu_plugins.integrations._wandb_logic import batch_sizes, format_group_id


def agreed_group(local: str | None, strategy: Any) -> str:
    """This worker's group name if every worker has one, else one drawn by the chief.

    Always one collective, so workers that differ (`KMP_JOB_ID` set on some only)
    never wait for each other in different calls.
    """
    if collective.agree(bool(local), strategy, how="all"):
        return local
    return agree_group_id(strategy)


def agree_group_id(strategy: Any) -> str:
    """A group name every worker holds: drawn by the chief, broadcast (a collective)."""
    drawn = secrets.randbits(62) if collective.is_chief() else 0
    return format_group_id(int(collective.broadcast(np.array([drawn], np.int64), strategy)[0]))


def job_config(model: Any, strategy: Any, mode: str) -> dict[str, Any]:
    """How this job is distributed, and with which versions."""
    import tensorflow as tf

    from keras_mgpu_plugins import __version__

    gpus = tf.config.list_physical_devices("GPU")
    models = [tf.config.experimental.get_device_details(g).get("device_name", "") for g in gpus]
    config = {
        "strategy": strategy_name(tf, strategy),
        "num_workers": collective.num_workers(),
        "num_replicas": int(strategy.num_replicas_in_sync),
        "devices": strategy_devices(tf, strategy),
        "gpu_models": models,
        "python_version": platform.python_version(),
        "tensorflow_version": tf.__version__,
        "keras_version": keras.__version__,
        "keras_mgpu_plugins_version": __version__,
    }
    if mode == "group":
        config["worker_index"] = collective.worker_index()
    return config


def strategy_name(tf: Any, strategy: Any) -> str:
    """The public `tf.distribute` name of `strategy` (`"default"` for TF's default one)."""
    for name in ("MultiWorkerMirroredStrategy", "MirroredStrategy", "OneDeviceStrategy", "TPUStrategy"):
        if isinstance(strategy, getattr(tf.distribute, name)):
            return name
    return "default" if strategy is tf.distribute.get_strategy() else type(strategy).__name__


def strategy_devices(tf: Any, strategy: Any) -> list[str]:
    """This worker's devices under `strategy` (TF's default strategy: the first GPU, else CPU)."""
    try:
        return [str(d) for d in strategy.extended.worker_devices]
    except RuntimeError:  # "worker_devices() method unsupported by default" strategy
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return [devices[0].name]


def measured_batch_sizes(model: Any, batches_done: int) -> dict[str, int]:
    """Batch sizes from the rows the loss tracker counted on this worker's replicas."""
    counts = compat.loss_tracker_rows(model)
    if counts is None:
        return {}
    return batch_sizes(counts, batches_done, int(model.distribute_strategy.num_replicas_in_sync))
