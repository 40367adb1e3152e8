"""How a parameter-server model's variables are split over the parameter servers.

`@kmp.parallelize(strategy="parameter_server")` takes `variable_partitioner`,
`min_shard_bytes` and `max_shards`; this module checks them (no backend needed), and
the TensorFlow backend makes TensorFlow's partitioner from them once the number of
parameter servers is known (`backends/tensorflow/parameter_server/cluster.py`).
By default a variable is split along its first axis into shards of at least 256 KiB,
at most one per parameter server (TensorFlow's recommended `MinSizePartitioner`):
small variables stay whole, an embedding table of millions of rows is spread over
every parameter server.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: The smallest shard TensorFlow's documentation recommends (256 KiB).
DEFAULT_MIN_SHARD_BYTES = 256 << 10


@dataclasses.dataclass(frozen=True)
class Partition:
    """The partitioning asked of `@kmp.parallelize(strategy="parameter_server")`.

    Attributes:
        variable_partitioner: `"auto"` (shards of at least `min_shard_bytes`, at most
            `max_shards`), `None` (every variable whole, placed round-robin over the
            parameter servers), or a `tf.distribute.experimental.partitioners.Partitioner`.
        min_shard_bytes: For `"auto"`: the smallest shard in bytes (default 256 KiB).
        max_shards: For `"auto"`: the most shards of one variable (default: the number
            of parameter servers).
    """

    variable_partitioner: Any = "auto"
    min_shard_bytes: int | None = None
    max_shards: int | None = None

    def __post_init__(self) -> None:
        for name in ("min_shard_bytes", "max_shards"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive integer or None. Received: "
                                 f"{name}={value!r}")
        if not isinstance(self.variable_partitioner, str) and self.variable_partitioner is not None:
            if not callable(self.variable_partitioner):
                raise ValueError(
                    'variable_partitioner must be "auto", None or a tf.distribute.experimental.'
                    "partitioners.Partitioner (e.g. MaxSizePartitioner, FixedShardsPartitioner). "
                    f"Received: variable_partitioner={self.variable_partitioner!r}")
        elif self.variable_partitioner not in ("auto", None):
            raise ValueError(
                'variable_partitioner must be "auto", None or a tf.distribute.experimental.'
                f"partitioners.Partitioner. Received: variable_partitioner="
                f"{self.variable_partitioner!r}")
        if self.variable_partitioner != "auto" and (self.min_shard_bytes or self.max_shards):
            raise ValueError(
                'min_shard_bytes and max_shards choose the shards of variable_partitioner="auto"; '
                "a partitioner of your own (or None) decides alone. Received: "
                f"variable_partitioner={self.variable_partitioner!r}, min_shard_bytes="
                f"{self.min_shard_bytes!r}, max_shards={self.max_shards!r}")

    @property
    def is_default(self) -> bool:
        return self == Partition()

    def key(self) -> tuple:
        """What identifies this choice (two factories of one process must agree on it)."""
        partitioner = self.variable_partitioner
        if partitioner is not None and not isinstance(partitioner, str):
            partitioner = id(partitioner)
        return (partitioner, self.min_shard_bytes, self.max_shards)

    def describe(self) -> str:
        if self.variable_partitioner is None:
            return "variable_partitioner=None (no variable split)"
        if self.variable_partitioner != "auto":
            return f"variable_partitioner={self.variable_partitioner!r}"
        return (f"min_shard_bytes={self.min_shard_bytes or DEFAULT_MIN_SHARD_BYTES}, "
                f"max_shards={self.max_shards or 'the number of parameter servers'}")
