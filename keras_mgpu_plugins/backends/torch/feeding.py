"""How each torch process takes its part of a global batch (`inputs.sharing.Sharing`).

A global batch of `n` rows on `P` processes: where `n >= P`, process `p` feeds a
contiguous slice of `n // P` rows, one more for the first `n % P` processes (uneven
where `P` does not divide `n`), and its gradient counts `n_p / n` of the step's
(`gradients`), so the step is one device's on the `n` rows whatever the split. Where
`n < P` every process feeds the whole batch, each gradient counts `1 / P`, and the
metrics count it once (rank 0's: `steps`). BatchNormalization normalises each process's
rows with their own statistics (DDP's default), or the whole batch's with
`sync_batchnorm=True`.

Each piece's `StepInfo` goes to the model's queue as Keras reads it; the step that
trains on that piece takes it (`take`), checking the rows match.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from keras_mgpu_plugins.inputs.sharing import Sharing


class StepInfo(NamedTuple):
    """One piece kmp fed: the global batch's rows, this process's, whether it is whole."""

    count: int
    rows: int
    whole: bool


class TorchSharing(Sharing):
    """Uneven contiguous slices where a batch has at least one row per process, else whole."""

    def __init__(self, runtime: Any, queue: Any) -> None:
        super().__init__(runtime, partial=True)
        self.queue = queue

    def span(self, count: int) -> tuple[int, int] | None:
        if count < self.processes:
            return None
        base, extra = divmod(count, self.processes)
        start = self.index * base + min(self.index, extra)
        return start, start + base + (self.index < extra)

    def start_pass(self) -> None:
        self.queue.clear()  # pieces read for a peek (Keras's symbolic build) or a pass cut short

    def keras_order(self, total: int, batch: int, mode: Any) -> Any:
        """A pass's rows as Keras's torch `DataLoader` of arrays draws them on one process
        (`torch_order`)."""
        return torch_order(total, batch, mode)

    def deliver(self, taken: Any, count: int, whole: bool) -> Any:
        span = self.span(count)
        rows = count if span is None else span[1] - span[0]
        self.queue.append(StepInfo(count, rows, span is None))
        return taken


def torch_order(total: int, batch: int, mode: Any) -> Any:
    """A pass's rows in the order Keras's array adapter on torch draws them (compat private
    use `torch_array_sampler`): `shuffle=True` is a `RandomSampler` without a generator,
    which seeds a generator of its own from torch's global one, then `randperm` of all rows;
    `"batch"` permutes each batch's rows with the global generator, batch after batch. The
    `DataLoader` draws its base seed before, from the global generator too: kmp's own
    `DataLoader` over the process's share does the same, so the draws happen in Keras's
    order."""
    import numpy as np
    import torch

    if mode != "batch":
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
        return torch.randperm(total, generator=generator).numpy().astype(np.int64)
    return np.concatenate([start + torch.randperm(min(batch, total - start)).numpy()
                           for start in range(0, total, batch)]).astype(np.int64)


def take(found: Any, data: Any) -> StepInfo | None:
    """The `StepInfo` of the batch a step trains on (`None`: a batch kmp did not feed, e.g.
    `train_on_batch`: each process's own rows, counted alike).

    Raises:
        RuntimeError: If the batch is not the piece kmp fed next (its rows differ).
    """
    import keras

    if found is None or not found.queue:
        return None
    info = found.queue.popleft()
    leaves = [a for a in keras.tree.flatten(data) if getattr(a, "shape", ())]
    rows = int(leaves[0].shape[0]) if leaves else info.rows
    if rows != info.rows:
        found.queue.clear()
        raise RuntimeError(
            f"kmp fed this process {info.rows} rows of a global batch of {info.count}, but the "
            f"step received {rows}: Keras read the input in another order than kmp expects "
            "(please report it, with your Keras version). The step would weight this "
            "process's gradient wrongly, so it stops here.")
    return info
