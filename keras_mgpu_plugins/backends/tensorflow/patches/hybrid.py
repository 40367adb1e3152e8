"""TensorFlow internals `strategy="hybrid"` reads (re-exported by `compat`).

`collective_ops_configured()`: TensorFlow has no public way to ask whether this process's
collective runtime is already configured, i.e. whether a `MultiWorkerMirroredStrategy`
exists. A second one made by `"hybrid"` beside a user's own would share that runtime and
its collective keys (two strategies issuing the same instance keys: wrong sums or a hang),
so `kmp.strategy.hybrid_strategy()` refuses it. Known for TensorFlow 2.16 to 2.21 (the
attribute `_collective_ops_server_def` of the eager context, set by
`configure_collective_ops`); elsewhere the attribute may be gone, and the answer is
`False` (no detection: the user's strategy must then be given to kmp to be seen).

`this_task()`: in a multi-worker job TensorFlow lists every worker's devices by full name;
which of them are this process's is the eager context's host address space (no public
API names it). Known for TensorFlow 2.16 to 2.21 (`Context.host_address_space`).
"""

from __future__ import annotations

from keras_mgpu_plugins.compat._names import resolve
from keras_mgpu_plugins.compat._private_uses import require

__all__ = ["collective_ops_configured", "this_task"]


def collective_ops_configured() -> bool:
    """Whether a multi-worker strategy already configured this process's collective ops."""
    require("eager_context")
    return getattr(resolve("eager context").context(), "_collective_ops_server_def", None) is not None


def this_task() -> str:
    """This process's address space, e.g. `/job:worker/replica:0/task:1` (starts the runtime)."""
    require("eager_context")
    return resolve("eager context").context().host_address_space()
