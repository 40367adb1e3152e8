"""The private Keras and torch API the torch lane touches (`backends/torch`), as the fields of
`compat._private_uses.PrivateUse` records (that module builds them; this one imports none
of the registry), and the checks behind them.

Run-tested: Keras 3.10.0 and 3.15.1 with torch 2.13.0 (CPU, gloo), and keras-nightly
3.16.0.dev (the canary). Each check reads the installed code; torch's are skipped where
torch is not installed (the torch lane is then never reached).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect

_MAX = "3.16.0"
C10D = "torch.distributed.distributed_c10d"
BATCH_NORM = "keras.src.layers.normalization.batch_normalization"
TORCH_TRAINER = "keras.src.backend.torch.trainer"


def _torch_there() -> bool:
    return importlib.util.find_spec("torch") is not None


def check_default_store() -> list[str]:
    """What `torch_default_store` needs: `_get_default_store()` of torch's c10d module."""
    if not _torch_there():
        return []
    found = getattr(importlib.import_module(C10D), "_get_default_store", None)
    return [] if callable(found) else [f"{C10D}._get_default_store is gone"]


def check_batchnorm_moments() -> list[str]:
    """What `batchnorm_moments` needs: `BatchNormalization._moments(self, inputs, mask)`
    and `_reduction_axes`, read from Keras's source."""
    import keras

    moments = getattr(keras.layers.BatchNormalization, "_moments", None)
    if moments is None:
        return ["keras.layers.BatchNormalization._moments is gone"]
    if list(inspect.signature(moments).parameters) != ["self", "inputs", "mask"]:
        return [f"BatchNormalization._moments{inspect.signature(moments)} changed"]
    source = inspect.getsource(keras.layers.BatchNormalization)
    return [] if "_reduction_axes" in source else ["BatchNormalization._reduction_axes is gone"]


def check_upstream_ddp() -> list[str]:
    """Nothing to miss: a Keras without `ddp_model` in its torch trainer has no DDP in fit
    (kmp averages the gradients itself); read only where Keras runs on torch."""
    return []


TORCH_PRIVATE_USES: tuple[dict, ...] = (
    {"name": "torch_default_store",
     "touches": f"{C10D}._get_default_store (the key-value store of the default process group)",
     "used_by": "kmp's check that every torch process makes the same fit/evaluate/predict call "
                "(runtime.calls)",
     "min_version": "2.4.0", "max_version": "2.14.0", "check": check_default_store,
     "outside": "The check is skipped: a fit/evaluate/predict made on one process only waits "
                "for the others (kmp-launch's StallWatchdog reports it).",
     "fallback": True, "library": "torch"},
    {"name": "batchnorm_moments",
     "touches": f"{BATCH_NORM}.BatchNormalization._moments(inputs, mask), _reduction_axes",
     "used_by": "kmp.parallelize(sync_batchnorm=True) on torch (batch statistics over every "
                "process)", "min_version": "3.10.0", "max_version": _MAX,
     "check": check_batchnorm_moments,
     "outside": "Use sync_batchnorm=False (each process's own statistics, as DDP's default)."},
    {"name": "torch_upstream_ddp",
     "touches": f"{TORCH_TRAINER}: the trainer's ddp_model (DistributedDataParallel made in "
                "fit where a process group exists, keras-team/keras#23316)",
     "used_by": "kmp's torch data parallelism (upstream's DDP where Keras has it, kmp's own "
                "gradient averaging where it does not)", "min_version": "3.10.0",
     "max_version": _MAX, "check": check_upstream_ddp,
     "outside": "kmp averages the gradients itself.", "fallback": True},
)
