"""One model per job: a `fit` that would train a separate model on each process is refused.

A script started as several processes (`kmp-launch`, `kmp.launch`, torchrun, srun,
`TF_CONFIG` by hand) whose model trains under nothing that spans the processes trains
one model per process, on every lane, silently: TensorFlow and JAX fit each process's
model on its own devices, torch's `fit` has no data parallelism up to Keras 3.15. kmp's
callbacks would then act for a job that does not exist (the chief's checkpoint holds the
chief's model only, an agreed stop agrees with nobody). So such a `fit` is refused on
every process, before its first step, with one message on every lane.

A backend provides one primitive, `apart(model)` (`backends/<name>/`): `None` where
`model` trains as one with the job's other processes (`@kmp.parallelize` built it, or the
job's own distribution holds it: a `MultiWorkerMirroredStrategy` scope on TensorFlow, a
`keras.distribution` spanning the processes on JAX, Keras's own DistributedDataParallel
on torch where it has one), else why not, in the lane's words. The rest is here:

- `check(model, here)` raises `SeparateModelsError` where the job has several processes
  and `model` trains apart. `kmp.runtime.of(model)` runs it, so every kmp callback given
  to a plain Keras `fit` refuses it at its train begin;
- once kmp joined the job (`kmp-launch`, `kmp.launch`, `python -m keras_mgpu_plugins.run`,
  `@kmp.parallelize`), `fit` itself runs it when given any callbacks (Keras's own
  included: `_same_callbacks`), before any callback runs;
- a `fit` of such a model without callbacks is that process's own: one process may do
  what one device does (a model loaded on the chief alone, trained and evaluated there).
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.errors import SeparateModelsError

__all__ = ["SeparateModelsError", "check", "given_callbacks"]


def check(model: Any, here: Any) -> None:
    """Raises `SeparateModelsError` where `model` would train apart on each of several
    processes; `here` is its runtime (`kmp.runtime.of(model)`'s, unchecked).

    Raises:
        SeparateModelsError: Naming this process's rank, the lane, why (the backend's
            words) and what works instead.
    """
    rank = here.rank()
    if rank.num_workers <= 1 or here.spans_workers:
        return
    from keras_mgpu_plugins import _backend

    why = _backend.active().apart(model)
    if why is None:
        return
    name = getattr(model, "name", None) or "the model"
    raise SeparateModelsError(
        f"This process is rank {rank.worker_index} of {rank.num_workers} processes on the "
        f"{_backend.lane()} lane, but {name}.fit would train a separate model on each "
        f"process: {why}. Build and compile the model in a function decorated with "
        "@kmp.parallelize (kmp then averages the gradients, feeds each process its part of "
        "every global batch and gives every process the same logs), or run one process. A "
        "model used on one process alone (loaded there, under `if kmp.topology().is_chief:`) "
        "trains there as on one device when fit without callbacks.")


def given_callbacks(callbacks: Any) -> list:
    """The callbacks a user gave `fit` (a list, or the members of a `CallbackList`, less the
    History and progress bar Keras adds itself)."""
    import keras

    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.CallbackList):
        own = (keras.callbacks.History, keras.callbacks.ProgbarLogger)
        return [c for c in callbacks.callbacks if not isinstance(c, own)]
    return list(callbacks)
