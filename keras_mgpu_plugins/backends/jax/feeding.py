"""How each JAX process takes its part of a global batch (`inputs.sharing.Sharing`).

A global batch of `n` rows under a distribution whose batch axis spans `D` devices, on
`P` processes: where `D` divides `n`, process `p` feeds rows `[p*n/P, (p+1)*n/P)` and
Keras (`auto_shard_dataset=False`) assembles the processes' shares into the one global
batch (`jax.make_array_from_process_local_data`), the very batch one device trains on.
Where `D` does not divide `n` (a last batch, or `batch_size` itself), the batch is fed
whole to every device, as one global array replicated on the mesh (`batches.replicated`,
through kmp's `_distribute_data`: compat feature `jax_partial_batches_replicated`); where
the installed Keras is outside that feature's versions, such a batch is refused, naming it.
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.backends.jax import batches
from keras_mgpu_plugins.inputs.sharing import Sharing


class JaxSharing(Sharing):
    """Even slices where a batch divides over the batch axis, else the whole batch on every
    device (see the module docstring)."""

    over = "devices of the distribution"
    feature = "jax_partial_batches_replicated"

    def __init__(self, runtime: Any, distribution: Any, partial: bool) -> None:
        import jax

        super().__init__(runtime, partial)
        # JAX's own count: one process's model (loaded there) is never arranged here
        self.index, self.processes = jax.process_index(), jax.process_count()
        self.distribution = distribution

    def divisor(self) -> int:
        return batches.axis_size(self.distribution)

    def deliver(self, taken: Any, count: int, whole: bool) -> Any:
        return batches.replicated(taken, self.distribution) if whole else taken

    def warn_if_never_divides(self, batch_size: int, method: str) -> None:
        if self.partial:  # else `check_rows` refuses the batch size itself
            batches.warn_if_never_divides(batch_size, self.distribution, method)
