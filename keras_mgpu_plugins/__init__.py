"""keras_mgpu_plugins: existing Keras projects on several GPUs or machines.

Public API; heavy modules (TensorFlow, callbacks, W&B) load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from keras_mgpu_plugins import backends as _backends  # noqa: F401 - hands its dispatcher to `_backend`
from keras_mgpu_plugins._version import __version__
from keras_mgpu_plugins.errors import WeightsOutOfSyncError
from keras_mgpu_plugins.topology import Topology, TopologyError, topology  # (cluster.topology)

if TYPE_CHECKING:  # pragma: no cover
    from keras_mgpu_plugins import callbacks, collective, compat, runtime
    from keras_mgpu_plugins.devices import simulate_devices
    from keras_mgpu_plugins.launch import launch
    from keras_mgpu_plugins.model_parallel import PlacementReport, placement_report
    from keras_mgpu_plugins.multi_gpu import multi_gpu_model
    from keras_mgpu_plugins.parallelize import parallelize
    from keras_mgpu_plugins.verify import VerifyReport, verify

__all__ = [
    "PlacementReport",
    "Topology",
    "TopologyError",
    "WeightsOutOfSyncError",
    "__version__",
    "callbacks",
    "collective",
    "compat",
    "launch",
    "multi_gpu_model",
    "parallelize",
    "placement_report",
    "runtime",
    "simulate_devices",
    "topology",
    "verify",
    "VerifyReport",
]

_LAZY = {
    "parallelize": ("keras_mgpu_plugins.parallelize", "parallelize"),
    "simulate_devices": ("keras_mgpu_plugins.devices", "simulate_devices"),
    "launch": ("keras_mgpu_plugins.launch", "launch"),
    "multi_gpu_model": ("keras_mgpu_plugins.multi_gpu", "multi_gpu_model"),
    "placement_report": ("keras_mgpu_plugins.model_parallel", "placement_report"),
    "PlacementReport": ("keras_mgpu_plugins.model_parallel", "PlacementReport"),
    "callbacks": ("keras_mgpu_plugins.callbacks", None),
    "collective": ("keras_mgpu_plugins.collective", None),
    "compat": ("keras_mgpu_plugins.compat", None),
    "runtime": ("keras_mgpu_plugins.runtime", None),
    "verify": ("keras_mgpu_plugins.verify", "verify"),
    "VerifyReport": ("keras_mgpu_plugins.verify", "VerifyReport"),
    # Modules reached as attributes in user code (`kmp.strategy.StrategyError`): loaded on use.
    "strategy": ("keras_mgpu_plugins.strategy", None),
    "devices": ("keras_mgpu_plugins.devices", None),
}

#: Lazy names that load without Keras (the registry and the launcher import it on use).
_NEEDS_NO_KERAS = frozenset({"compat", "launch", "runtime", "verify", "VerifyReport"})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'keras_mgpu_plugins' has no attribute {name!r}")
    if name not in _NEEDS_NO_KERAS:
        from keras_mgpu_plugins._backend import require_keras

        require_keras()  # an error naming the extras, rather than a bare ModuleNotFoundError
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
