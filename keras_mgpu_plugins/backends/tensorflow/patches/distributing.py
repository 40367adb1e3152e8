"""Is this distributed? The one answer, which every patch and `kmp.parallelize` ask.

Keras picks its multi-worker code paths with its own test of the strategy
(`_collective_all_reduce_multi_worker`, a registered private use); kmp's fixes act
exactly where those paths run, or where several replicas are in sync.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require


def distributing(strategy: Any) -> bool:
    """Whether `strategy` spans several replicas or workers (its steps hold collectives).

    The one answer to "is this distributed?": several replicas in sync, or Keras's own
    test of a multi-worker strategy (the one that picks Keras's multi-worker code paths).
    """
    require("collective_all_reduce_multi_worker")
    return strategy.num_replicas_in_sync > 1 or resolve("collective_all_reduce_multi_worker")(
        strategy)
