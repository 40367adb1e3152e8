"""Every Keras/TensorFlow workaround of the package, in one place.

Each patch names the upstream issue it works around, the Keras versions it is
known for (it is applied only there), and is tested by a real multi-worker run
that fails without it (`tests/multi_worker/test_fit.py`).

Users who build their own `tf.distribute.MultiWorkerMirroredStrategy` call
`kmp.compat.patch_keras()` once; `parallelize` does it for them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from packaging.version import Version

_lock = threading.Lock()
_applied: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class Patch:
    """A workaround: what it fixes, where, and for which Keras versions."""

    name: str
    upstream: str
    min_version: str
    max_version: str  # exclusive: the first version not known to need it
    apply: Callable[[], Any]

    def applies_to(self, version: str) -> bool:
        v = Version(version)
        return Version(self.min_version) <= v < Version(self.max_version)


# --- keras-team/keras#20585 (1/2): symbolic build reduces the per-replica batch ---


def _patch_symbolic_build() -> Any:
    """`TensorFlowTrainer._maybe_symbolic_build` takes one local replica's batch.

    Upstream reduces the first distributed batch with `strategy.reduce("MEAN",
    batch, axis=None)` to get example shapes; under MultiWorkerMirroredStrategy that
    reduce cannot take the nested per-replica input and `fit`, `evaluate` and
    `predict` fail before the first step. The batch is only needed for its
    shapes and dtypes, so the first local replica's part serves.
    """
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.TensorFlowTrainer._maybe_symbolic_build

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        strategy = self.distribute_strategy
        if iterator is not None:
            for _, _, it in iterator:
                data_batch = tree.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    next(it),
                )
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    return lambda: setattr(tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build", original)


# --- keras-team/keras#20585 (2/2): scalar logs reduced with axis=0 -----------------


def _patch_reduce_per_replica() -> Any:
    """`reduce_per_replica` averages multi-worker logs element-wise across replicas.

    Upstream calls `strategy.reduce("MEAN", v, axis=0)` under multi-worker mode,
    which fails on the scalar losses and metrics that `train_step` returns (and
    would average over a batch axis for anything else). The mean across
    replicas is `axis=None`.
    """
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(
            strategy
        ):
            return tree.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values
            )
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica
    return lambda: setattr(tf_trainer, "reduce_per_replica", original)


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="symbolic_build_per_replica_batch",
        upstream="https://github.com/keras-team/keras/issues/20585",
        min_version="3.0.0",
        max_version="3.16.0",
        apply=_patch_symbolic_build,
    ),
    Patch(
        name="multi_worker_scalar_log_reduce",
        upstream="https://github.com/keras-team/keras/issues/20585",
        min_version="3.0.0",
        max_version="3.16.0",
        apply=_patch_reduce_per_replica,
    ),
)


def patch_keras() -> list[str]:
    """Applies the Keras workarounds known for the installed version. Idempotent.

    Only the TensorFlow backend is patched; other backends are left untouched.

    Returns:
        The names of the patches in force after the call.

    Example:
        >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()
        >>> kmp.compat.patch_keras()
        ['symbolic_build_per_replica_batch', 'multi_worker_scalar_log_reduce']
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return []
    with _lock:
        for patch in PATCHES:
            if patch.name not in _applied and patch.applies_to(keras.__version__):
                _applied[patch.name] = patch.apply()
        return list(_applied)


def unpatch_keras() -> None:
    """Undoes every applied patch (for tests that prove a patch is needed)."""
    with _lock:
        for name in reversed(list(_applied)):
            _applied.pop(name)()
