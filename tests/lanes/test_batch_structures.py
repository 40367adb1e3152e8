"""Any batch structure Keras's own `fit` takes from a `tf.data.Dataset`, a grain dataset or a
torch `DataLoader` passes through the `PyDataset` kmp serves such inputs as (`inputs.packed`),
on every lane; the lane's step unpacks it (torch end to end: `tests/torch/test_parity.py`,
`four_parts`). Before, a batch of 4 parts (a GAN's images, labels, noise, weights) failed:
"PyDataset.__getitem__() must return a tuple or a dict"."""

from __future__ import annotations

import numpy as np
import pytest

from keras_mgpu_plugins.inputs import datasets, packed


def four_part_batches(count: int = 3) -> list:
    return [tuple(np.full((2, 1), 10 * i + part, "float32") for part in range(4))
            for i in range(count)]


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 5])
def test_a_batch_of_any_number_of_parts_reaches_the_step_as_yielded(parts):
    from keras.src.trainers.data_adapters import get_data_adapter  # the adapter fit picks

    batches = [b[:parts] if parts <= 4 else (*b, b[0]) for b in four_part_batches()]
    served = datasets.passes(batches, "grain")  # read as an input's passes, as kmp serves one
    seen = [packed.unpack(b) for b in get_data_adapter(served).get_numpy_iterator()]
    assert len(seen) == len(batches)
    for got, want in zip(seen, batches, strict=True):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)


def test_only_what_the_pydataset_adapter_refuses_is_packed():
    a = np.zeros((2, 1))
    for taken in (a, (a,), (a, a), (a, a, a), {"x": a, "y": a}):
        assert packed.pack(taken) is taken
    assert packed.pack((a, a, a, a)) == {packed.KEY: (a, a, a, a)}
    assert packed.unpack({packed.KEY: (a, a, a, a)}) == (a, a, a, a)
    assert packed.unpack({"x": a}) == {"x": a}
