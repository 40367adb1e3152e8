"""`TensorFlowStore`: `runtime.calls.Store` over TensorFlow's coordination service.

`MultiWorkerMirroredStrategy` starts a coordination service (on the chief's task) whose
key-value store every worker reaches through its eager context (private use
`tf_coordination_store`). TensorFlow 2.16 to 2.21 offer there a set, a get that blocks until
the key is set or a timeout passes, and a delete: no get that returns at once, no listing of
a directory. So:

- `get(key)`: TensorFlow's get with a short timeout (`miss_ms()`: 20 ms, or 4 times the
  slowest round trip this process measured, up to 1 s). A key that is there comes back in one
  round trip; an absent one costs the timeout, during which it is waited for (a key set
  meanwhile comes back at once). A key is set once, so a value read is kept.
- `dir(prefix)`: a `get` of `prefix + i` for each process index `i`: one round trip per
  key read before or there now, the timeout per absent one.
- Any other error of TensorFlow's (the chief, whose process holds the service, ended;
  a worker failed) raises `runtime.calls.StoreUnreachableError`, with TensorFlow's cause.
- A get that timed out stays open in the service until its key is set or the job ends
  (TensorFlow does not cancel it): a few hundred bytes each, on the chief. `runtime.calls`
  therefore asks whether a process ended only after it has waited a while, so calls that
  every worker makes in step (the usual case) leave none open.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

#: Shortest wait for a key that is not there (ms); longer where round trips are slower.
MISS_MS = 20
#: Longest wait for a key that is not there, per get (ms).
MAX_MISS_MS = 1000
_stores: dict[int, TensorFlowStore] = {}
_warned: list[bool] = []


class TensorFlowStore:
    """`runtime.calls.Store` of one job's `processes` workers, over `context` (TensorFlow's
    eager context, its coordination service running)."""

    def __init__(self, context: Any, processes: int) -> None:
        self.context = context
        self.processes = processes
        self.slowest = 0.0  # seconds: the slowest set or successful get seen
        self._read: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        import tensorflow as tf

        start = time.monotonic()
        try:
            self.context.set_config_key_value(key, value)
        except tf.errors.OpError as err:
            raise _unreachable(err) from err
        self.slowest = max(self.slowest, time.monotonic() - start)
        self._read[key] = value

    def get(self, key: str) -> str | None:
        if key in self._read:
            return self._read[key]
        import tensorflow as tf

        start = time.monotonic()
        try:
            value = self.context.get_config_key_value(key, self.miss_ms())
        except tf.errors.DeadlineExceededError:
            return None
        except tf.errors.OpError as err:
            raise _unreachable(err) from err
        self.slowest = max(self.slowest, time.monotonic() - start)
        self._read[key] = value
        return value

    def dir(self, prefix: str) -> dict[int, str]:
        found = {i: self.get(f"{prefix}{i}") for i in range(self.processes)}
        return {i: value for i, value in found.items() if value is not None}

    def miss_ms(self) -> int:
        """How long a get waits for an absent key: `MISS_MS`, or 4 round trips, up to 1 s."""
        return int(min(MAX_MISS_MS, max(MISS_MS, 4000 * self.slowest)))


def _unreachable(err: Exception) -> Exception:
    from keras_mgpu_plugins.runtime.calls import StoreUnreachableError

    cause = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return StoreUnreachableError(
        "TensorFlow's coordination service, which runs in process 0 (the chief), cannot be "
        "reached or reports a failure: process 0 ended its script, or a process failed "
        f"(TensorFlow: {type(err).__name__}: {cause})")


def coordination_store(processes: int) -> TensorFlowStore | None:
    """This process's store over its coordination service, for a job of `processes` workers;
    `None` (one warning) where TensorFlow offers none: the calls check is then skipped."""
    from keras_mgpu_plugins.compat._private import tf_coordination_context
    from keras_mgpu_plugins.compat._private_uses import require

    if processes in _stores:
        return _stores[processes]
    context = tf_coordination_context()
    if context is None:
        if not _warned and require("tf_coordination_store"):  # else require warned already
            _warned.append(True)
            warnings.warn("TensorFlow's coordination service does not run in this process: "
                          "kmp cannot check that every worker makes the same fit/evaluate/"
                          "predict call (one made on one worker only waits for the others).",
                          UserWarning, stacklevel=3)
        return None
    _stores[processes] = TensorFlowStore(context, processes)
    return _stores[processes]
