"""`Sharing`: which rows of a global batch this process feeds, and how they reach Keras.

The base class splits a global batch of `n` rows evenly over the `P` processes where
`n` divides (process `p` feeds rows `[p*n/P, (p+1)*n/P)`) and feeds it whole to every
process where it does not; each backend adapts it (`backends.jax.feeding`: the divisor
is the devices of the distribution's batch axis, a whole batch becomes one array
replicated on every device; `backends.torch.feeding`: uneven splits, each process's
gradient weighted by its rows). Every method is a pure function of the global batch's
row count and this process's place, so every process decides alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Sharing:
    """How this process takes its part of each global batch (see the module docstring).

    Attributes:
        runtime: The `kmp.runtime.Runtime` of the processes (seeds, checks).
        index: This process's rank.
        processes: How many processes share each global batch.
        partial: Whether a batch that cannot be split is fed whole (else it is refused,
            `check_rows`).
    """

    #: What the pieces are spread over, for messages.
    over = "processes"
    #: The compat feature that lets a batch that does not split be fed whole (messages).
    feature = ""

    def __init__(self, runtime: Any, partial: bool = True) -> None:
        rank = runtime.rank()
        self.runtime, self.index, self.processes = runtime, rank.worker_index, rank.num_workers
        self.partial = partial

    @property
    def several(self) -> bool:
        return self.processes > 1

    def divisor(self) -> int:
        """How many equal pieces a batch is cut into where it divides."""
        return self.processes

    def span(self, count: int) -> tuple[int, int] | None:
        """Rows `[start, stop)` of a global batch of `count` rows this process feeds; `None`:
        the whole batch (it does not split)."""
        if count % self.divisor():
            return None
        size = count // self.processes
        return self.index * size, (self.index + 1) * size

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The positions (global row numbers) of one global batch this process feeds."""
        span = self.span(len(positions))
        return positions if span is None else positions[span[0]:span[1]]

    def piece(self, batch: Any, count: int) -> Any:
        """This process's part of `batch` (a global batch of `count` rows, whole here)."""
        import keras

        span = self.span(count)
        if span is not None:
            batch = keras.tree.map_structure(
                lambda a: a[span[0]:span[1]] if _is_array(a) else a, batch)
        return self.deliver(batch, count, span is None)

    def start_pass(self) -> None:
        """Keras starts reading an input from its first batch (a new pass over it)."""

    def keras_order(self, total: int, batch: int, mode: Any) -> np.ndarray:
        """A pass's rows in the order Keras's own `fit` draws them for arrays on one process
        of this backend, advancing the global random state as it does (`inputs.shuffle`):
        here NumPy's (Keras's NumPy iterator, the JAX backend's)."""
        from keras_mgpu_plugins.inputs import shuffle

        return shuffle.numpy_order(total, batch, mode)

    def deliver(self, taken: Any, count: int, whole: bool) -> Any:
        """`taken` (this process's rows of a batch of `count`) as Keras is given it."""
        return taken

    def check_rows(self, count: int, what: str) -> None:
        """Raises where a batch of `count` rows can be neither split nor fed whole."""
        if not self.partial and count % self.divisor():
            feature = f": {self.feature}" if self.feature else ""
            raise ValueError(
                f"{what}: a batch of {count} rows does not divide over the {self.divisor()} "
                f"{self.over}, and the installed Keras does not let kmp feed such a batch "
                f"whole (kmp.compat.report(){feature}). Use batches whose rows are a "
                f"multiple of {self.divisor()}.")

    def warn_if_never_divides(self, batch_size: int, method: str) -> None:
        """Called once per call with the global `batch_size`, where batches are fed whole."""


def _is_array(value: Any) -> bool:
    return bool(getattr(value, "shape", ()))
