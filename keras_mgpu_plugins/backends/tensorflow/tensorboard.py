"""TensorBoard scalars written with TensorFlow alone (no `tensorboard` package needed)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping


class ScalarWriter:
    """Writes `{tag: value}` records as TensorBoard scalars of one event file.

    Uses `tf.summary.write` with the scalar plugin's metadata, so it needs
    TensorFlow only (not the `tensorboard` package) to write. NaN values are
    left out.

    Args:
        logdir: Directory of the event file.
    """

    def __init__(self, logdir: str) -> None:
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        self._tf = tf
        self._writer = tf.summary.create_file_writer(os.fspath(logdir))
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR,
        )

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Writes each value at `step`, then flushes the file."""
        tf = self._tf
        with self._writer.as_default():
            for tag, value in scalars.items():
                if not math.isnan(value):
                    tf.summary.write(tag, tf.constant(value, tf.float32), step=step,
                                     metadata=self._metadata)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
