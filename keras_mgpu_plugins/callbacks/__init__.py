"""Callbacks: drop-ins for what users pass to `model.fit`, safe with several devices.

Each class loads on first use, so importing this package does not import every
callback's dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from keras_mgpu_plugins.callbacks.backup_and_restore import BackupAndRestore
    from keras_mgpu_plugins.callbacks.device_metrics_logger import DeviceMetricsLogger
    from keras_mgpu_plugins.callbacks.early_stopping import EarlyStopping
    from keras_mgpu_plugins.callbacks.model_checkpoint import ModelCheckpoint
    from keras_mgpu_plugins.callbacks.parallel_model_checkpoint import ParallelModelCheckpoint
    from keras_mgpu_plugins.callbacks.stall_watchdog import StallWatchdog
    from keras_mgpu_plugins.callbacks.weight_sync_verifier import WeightSyncVerifier

_MODULES = {
    "ModelCheckpoint": "model_checkpoint",
    "ParallelModelCheckpoint": "parallel_model_checkpoint",
    "EarlyStopping": "early_stopping",
    "BackupAndRestore": "backup_and_restore",
    "DeviceMetricsLogger": "device_metrics_logger",
    "WeightSyncVerifier": "weight_sync_verifier",
    "StallWatchdog": "stall_watchdog",
}

__all__ = [
    "BackupAndRestore",
    "DeviceMetricsLogger",
    "EarlyStopping",
    "ModelCheckpoint",
    "ParallelModelCheckpoint",
    "StallWatchdog",
    "WeightSyncVerifier",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'keras_mgpu_plugins.callbacks' has no attribute {name!r}")
    from keras_mgpu_plugins._backend import require_keras

    require_keras()  # an error naming the extras, rather than a bare ModuleNotFoundError
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
