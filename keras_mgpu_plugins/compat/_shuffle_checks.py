"""The check behind the private use `keras_shuffle_draws`: how Keras's own input adapters draw
a shuffled order on one process, which kmp draws alike on several (`inputs.shuffle`).

Read from the installed Keras's source: the array adapter's NumPy iterator draws
`np.random.permutation` of all rows at a pass's start (`"batch"`: of each batch's rows), its
torch `DataLoader` a `RandomSampler` without a generator (`RandomBatchSampler`'s
`torch.randperm` for `"batch"`), and the `PyDataset` adapter `random.shuffle` of the batch
indices. A Keras that draws otherwise would make kmp's processes train on other global
batches than one device: the check fails and kmp refuses to shuffle on several processes.
"""

from __future__ import annotations

import inspect

from keras_mgpu_plugins.compat._checks import CHECKED_BELOW

#: What each adapter's source must still say, by (module, attribute).
EXPECTED = {
    ("keras.src.trainers.data_adapters.array_data_adapter", "ArrayDataAdapter"): (
        "np.random.permutation(self._num_samples)",
        "np.random.permutation(stop - start) + start",
        "torch.utils.data.RandomSampler(range(self._num_samples))",
        "torch.randperm(len(batch))",
    ),
    ("keras.src.trainers.data_adapters.py_dataset_adapter", None): (
        "random.shuffle(indices)",
    ),
}


def check_shuffle_draws() -> list[str]:
    """What of Keras's shuffle draws changed (empty: kmp draws as Keras does)."""
    import importlib

    problems = []
    for (module, attribute), lines in EXPECTED.items():
        found = importlib.import_module(module)
        source = inspect.getsource(getattr(found, attribute) if attribute else found)
        where = f"{module}.{attribute}" if attribute else module
        problems += [f"{where} no longer has `{line}`" for line in lines if line not in source]
    return problems


#: The fields of the private use `keras_shuffle_draws` (`compat._private_uses` makes it).
SHUFFLE_PRIVATE_USE = {
    "name": "keras_shuffle_draws",
    "touches": "how Keras's input adapters draw a shuffle on one process (array adapter: "
               "np.random.permutation, torch's RandomSampler / randperm; PyDataset adapter: "
               "random.shuffle)",
    "used_by": "fit(shuffle=True) on several processes (JAX, torch): every process draws one "
               "device's order as Keras does (inputs.shuffle)",
    "min_version": "3.10.0", "max_version": CHECKED_BELOW["keras"], "check": check_shuffle_draws,
    "outside": "kmp cannot draw one device's order: pass shuffle=False, or shuffle the arrays "
               "yourself (seeded alike on every process) before fit.",
}
