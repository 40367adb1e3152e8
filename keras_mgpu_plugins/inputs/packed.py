"""Any batch structure Keras's own `fit` takes, through the `PyDataset` kmp serves.

kmp serves a `tf.data.Dataset`, a grain dataset and a torch `DataLoader` on several
processes as a `keras.utils.PyDataset` of each process's share (`inputs.datasets`). Keras's
own adapters for those inputs pass any batch structure to the step (a GAN's `(images,
labels, noise, weights)`, unpacked by its own `train_step`), but Keras's `PyDataset` adapter
takes only `(x,)`, `(x, y)`, `(x, y, sample_weight)`, an array or a dict ("PyDataset.
__getitem__() must return a tuple or a dict"). So a batch it would refuse travels packed,
as a dict of one key (`KEY`), and the step of the lane unpacks it before the model's own
`train_step`, `test_step` or `predict_step` sees it (torch: `backends.torch.steps`; JAX:
`backends.jax.batches.distribute`, Keras's `_distribute_data`): the model sees the batch as
on one device.
"""

from __future__ import annotations

from typing import Any

#: The one key of a packed batch.
KEY = "_kmp_packed_batch"


def takes(batch: Any) -> bool:
    """Whether Keras's `PyDataset` adapter takes `batch` as it is."""
    if isinstance(batch, dict) or not isinstance(batch, (tuple, list)):
        return True  # a dict; an array is `(x,)` to Keras
    return 1 <= len(batch) <= 3


def pack(batch: Any) -> Any:
    """`batch`, or a dict holding it where the `PyDataset` adapter would refuse it."""
    return batch if takes(batch) else {KEY: batch}


def unpack(data: Any) -> Any:
    """`data` as the input yielded it (a packed batch taken out of its dict)."""
    if isinstance(data, dict) and len(data) == 1 and KEY in data:
        return data[KEY]
    return data
