"""A `tf.data.Dataset`, a grain dataset or a torch `DataLoader` read as a `PyDataset` of its
global batches, in order, one pass whenever Keras starts from batch 0 (`inputs.streams`
then takes each process's share of every batch)."""

from __future__ import annotations

import functools
from typing import Any

from keras_mgpu_plugins.inputs import packed


def passes(dataset: Any, found: str, what: str = "") -> Any:
    """A `tf.data.Dataset`, grain dataset or `DataLoader` as a `PyDataset` read in order: a new
    pass over the dataset whenever Keras starts reading it from batch 0 (as Keras makes a new
    iterator of a dataset), `len` its length (`None`: infinite or unknown, with
    `steps_per_epoch`). A tf.data dataset's elements come through `as_numpy_iterator`, a
    grain dataset's and a `DataLoader`'s through `iter` (a `DataLoader`'s tensors as numpy
    arrays); TensorFlow, grain and torch are the user's, never imported here. A batch of a
    structure Keras's `PyDataset` adapter refuses (more than 3 parts) travels packed
    (`inputs.packed`): the lane's step unpacks it."""
    import keras

    convert = None
    if found == "tf.data.Dataset":
        cardinality = int(dataset.cardinality())
        batches: int | None = cardinality if cardinality >= 0 else None
        start = dataset.as_numpy_iterator
    else:
        if found == "DataLoader":
            _check_loader(dataset, what)
            convert = _loader_numpy
        try:
            batches = len(dataset)
        except TypeError:  # an IterDataset (an IterableDataset without __len__) has none
            batches = None
        start = functools.partial(iter, dataset)

    class Passes(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__()
            self.iterator: Any = None

        @property
        def num_batches(self) -> int | None:
            return batches

        def __len__(self) -> int:
            return batches

        def __getitem__(self, i: int) -> Any:
            if i == 0 or self.iterator is None:
                self.iterator = start()
            batch = next(self.iterator)
            return packed.pack(convert(batch) if convert else batch)  # (x, y, noise, w): kept

    return Passes()


def _check_loader(loader: Any, what: str) -> None:
    """A `DataLoader` that already gives each process its own rows is refused, naming why."""
    sampler = getattr(loader, "sampler", None)
    if type(sampler).__name__ == "DistributedSampler" or hasattr(sampler, "num_replicas"):
        raise ValueError(
            f"{what}: a torch DataLoader with a {type(sampler).__name__} feeds each process "
            "its own rows; kmp feeds each process its share of every global batch itself, as "
            "on one device. Pass the same DataLoader on every process, without a "
            "DistributedSampler (batch_size: the global batch size; shuffle=True with a "
            "torch.Generator seeded alike on every process).")


def _loader_numpy(batch: Any) -> Any:
    """A `DataLoader` batch with its tensors as numpy arrays (lists of a batch: tuples)."""
    import keras

    if isinstance(batch, list):
        batch = tuple(batch)
    return keras.tree.map_structure(
        lambda t: t.detach().cpu().numpy() if hasattr(t, "detach") else t, batch)
