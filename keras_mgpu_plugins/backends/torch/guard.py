"""The refusal of a job in which each torch process would train its own model.

Keras 3.15 and older have no data parallelism in `fit` on torch: started several times
(torchrun, kmp-launch, srun), a script trains one separate model per process, silently
(measured: 2 processes, each its half of 256 rows, weights 0.16 apart, losses 3.72 and
2.78). keras-nightly 3.16.0.dev wraps the model in `DistributedDataParallel` where a
process group exists (keras-team/keras#23316). A model `@kmp.parallelize` did not build,
in a job of several processes whose Keras would not keep one model, is refused at its
first `fit` on every process, naming the versions and what to do.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.backends.torch import collectives, models


class SeparateModelsError(RuntimeError):
    """Each process of the job would train a model of its own."""


def check_trains_together(model: Any) -> None:
    """Raises `SeparateModelsError` where `model` would train apart on each process."""
    import keras

    from keras_mgpu_plugins.backends.torch.runtime import TorchRuntime
    from keras_mgpu_plugins.compat._torch import keras_has_upstream_ddp

    rank = TorchRuntime().rank()
    if rank.num_workers <= 1 or models.arranged(model) is not None:
        return
    if keras_has_upstream_ddp() and collectives.initialized():
        return  # Keras's own DistributedDataParallel keeps one model
    version = keras.__version__
    if keras_has_upstream_ddp():
        why = (f"Keras {version} wraps the model in DistributedDataParallel only where a torch "
               "process group exists, and none was started here")
    else:
        why = (f"Keras {version} has no data parallelism in fit on torch (no release up to "
               "3.15 has: DistributedDataParallel in fit comes with keras-team/keras#23316, "
               "after 3.15)")
    raise SeparateModelsError(
        f"This process is rank {rank.worker_index} of {rank.num_workers} processes, but "
        f"{getattr(model, 'name', 'the model')}.fit would train a separate model on each "
        f"process: {why}. Build and compile the model in a function decorated with "
        "@kmp.parallelize (kmp then averages the gradients, feeds each process its share of "
        "every global batch and gives every process the same logs), or run one process.")
