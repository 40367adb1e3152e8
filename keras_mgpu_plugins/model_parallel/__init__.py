"""Model parallelism on one machine: `kmp.parallelize(strategy="model_parallel")`.

Backend-free here: the stage balancing (`balance`), the cost model (`costs`) and
`kmp.placement_report` (`report`). The TensorFlow placement itself (`build()` runs a
model factory, records the device scope of every layer call, places the calls that had
none in contiguous stages balanced by memory, and makes the placement hold whenever the
model runs) lives in `keras_mgpu_plugins.backends.tensorflow.model_parallel`. See
docs/model_parallelism.md.
"""

from __future__ import annotations

from keras_mgpu_plugins.model_parallel.report import PlacementReport, placement_report

__all__ = ["PlacementReport", "placement_report"]
