"""Model parallelism on one machine: `kmp.parallelize(strategy="model_parallel")`.

`build()` runs a model factory, records the device scope of every layer call, places the
calls that had none in contiguous stages balanced by memory, and makes the placement hold
whenever the model runs (`fit`, `evaluate`, `predict`, a `tf.function`). See
docs/model_parallelism.md.
"""

from __future__ import annotations

from keras_mgpu_plugins.model_parallel.factory import build
from keras_mgpu_plugins.model_parallel.report import PlacementReport, placement_report

__all__ = ["PlacementReport", "build", "placement_report"]
