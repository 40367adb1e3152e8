"""Inputs as on one device, on several processes: each fed its share of every global batch.

Users pass the same global inputs to `fit`/`evaluate`/`predict` on every process (numpy
arrays or dicts/lists of them with the global `batch_size`; the same `PyDataset`,
generator, `tf.data.Dataset`, grain dataset or `torch.utils.data.DataLoader` yielding the
global batches). kmp turns each into a `keras.utils.PyDataset` of this process's part of
every global batch, in one order on every process (`shuffle=True`: one permutation of
the global rows, shared), and checks that the processes' inputs agree.

Backend-neutral: what a backend decides is in its `Sharing` (`inputs.sharing`): which
rows of a global batch this process feeds, and how the piece reaches Keras. The JAX lane
(`backends.jax`) and the torch lane (`backends.torch`) both feed through here.

- `arrays`: arranges the arguments of one method (as Keras's own `Model.fit` defines them);
- `batches`: the `PyDataset` of this process's pieces of global arrays;
- `shuffle`: one shuffled global epoch, shared by the processes;
- `streams`: a `PyDataset`, generator, `tf.data`, grain or `DataLoader` input, checked.
"""
