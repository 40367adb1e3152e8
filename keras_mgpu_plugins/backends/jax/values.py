"""Variable values on the host, as JAX holds them: replicated, sharded, or across processes.

`np.asarray` reads a `jax.Array` whose devices are all this process's, or one
replicated on every device (each process holds a whole copy: `DataParallel`'s
variables). A value sharded over other processes' devices raises there
(`"Fetching value for jax.Array that spans non-addressable devices"`): it is
gathered with `jax.experimental.multihost_utils.process_allgather`, a
collective every process runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def readable_here(value: Any) -> bool:
    """Whether `np.asarray(value)` works in this process alone (no collective)."""
    return bool(getattr(value, "is_fully_addressable", True)
                or getattr(value, "is_fully_replicated", False))


def host_value(variable: Any) -> np.ndarray:
    """The whole value of a Keras variable (or `jax.Array`), on the host.

    Called by every process when the value spans processes unreplicated (a
    collective then), by any process otherwise.
    """
    value = getattr(variable, "value", variable)
    if readable_here(value):
        return np.asarray(value)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def snapshot_read(variable: Any) -> Any:
    """A copy of `variable`'s value that the next training step does not delete or change.

    Keras's JAX trainer donates its state to each step (the old buffers are
    deleted), so the current `variable.value` cannot be held across a step: it
    is copied on its own devices (every process runs the same copy). A value
    no process can read alone is gathered to the host instead (`host_value`).
    """
    import jax.numpy as jnp

    value = variable.value
    if not readable_here(value):
        return host_value(value)
    return jnp.copy(value)
