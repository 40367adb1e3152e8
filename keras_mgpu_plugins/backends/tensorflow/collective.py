"""The cross-worker primitives over a `tf.distribute` strategy, as functions (`kmp.collective`).

For code that holds a strategy (users' own loops, kmp's TensorFlow patches). Callbacks
ask `kmp.runtime.of(model)` instead, which serves every backend; these functions are
that runtime's answers for a strategy (default: the current one):

- `is_chief()`, `worker_index()`, `num_workers()`: read lazily, at call time,
  from the one source `whoami()` (the multi-worker strategy when there is one);
- `all_gather(vector)`: every worker's vector, stacked in worker order;
- `agree(flag)`: one boolean every worker holds after the call;
- `broadcast(value)`: the chief's value, on every worker;
- `together(action, what)`: runs this worker's part of a step; if it raised on
  any worker, every worker raises, naming that worker's error (no worker is
  left waiting alone); `gather_errors` is its one all-gather of error texts;
- `same_settings(settings, owner)`: raises on every worker if the arguments
  that decide where a callback's collectives run differ between workers.

Each is a collective: every worker must call it, in the same order, with
vectors of the same shape and dtype. In a single process (or under a strategy
that spans one worker) the answer is computed locally, so one code path serves
both cases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from keras_mgpu_plugins.backends.tensorflow.rank import (  # the one source of "who am I", re-exported
    check_env_agrees,
    forget_for_tests,
    note_strategy,
    spans_workers,
    whoami,
    workers_strategy,
)
from keras_mgpu_plugins.runtime import (  # noqa: F401 - re-exported, kmp.collective's names
    CAUSE_BYTES,
    ERROR_WIDTH,
    PeerFailedError,
    Rank,
    Runtime,
    SettingsDifferError,
    decode_error,
    encode_error,
)

__all__ = ["PeerFailedError", "Rank", "SettingsDifferError", "agree", "all_gather", "broadcast",
           "check_env_agrees", "forget_for_tests", "is_chief", "note_strategy", "num_workers",
           "same_settings", "spans_workers", "together", "whoami", "worker_index",
           "workers_strategy"]

T = TypeVar("T")


def _runtime(strategy: Any | None) -> Runtime:
    """The TensorFlow runtime of `strategy` (default: the current strategy)."""
    from keras_mgpu_plugins.backends.tensorflow.runtime import TensorFlowRuntime

    return TensorFlowRuntime(strategy)


def is_chief(strategy: Any | None = None) -> bool:
    """Whether this process is the chief (writes files, logs, uploads). See `whoami`."""
    return whoami(strategy).is_chief


def worker_index(strategy: Any | None = None) -> int:
    """This process's rank among the workers (0 for the chief). See `whoami`."""
    return whoami(strategy).worker_index


def num_workers(strategy: Any | None = None) -> int:
    """Number of processes that train together. See `whoami`."""
    return whoami(strategy).num_workers


def all_gather(vector: Any, strategy: Any | None = None) -> np.ndarray:
    """Gathers one array from every worker of `strategy`, stacked in worker order.

    See `kmp.runtime.Runtime.all_gather`; `strategy` defaults to the current one.
    """
    return _runtime(strategy).all_gather(vector)


def agree(flag: bool, strategy: Any | None = None, how: str = "any") -> bool:
    """One boolean decision every worker holds (`Runtime.agree`)."""
    return _runtime(strategy).agree(flag, how)


def broadcast(value: Any, strategy: Any | None = None, root: int = 0) -> np.ndarray:
    """The `root` worker's array (default: the chief's), on every worker."""
    return _runtime(strategy).broadcast(value, root)


def together(action: Callable[[], T], what: str, strategy: Any | None = None) -> T:
    """Runs `action()` here; raises on every worker, with the cause, if it raised on any
    (`Runtime.together`)."""
    return _runtime(strategy).together(action, what)


def gather_errors(error: BaseException | None, strategy: Any | None = None) -> str | None:
    """Every worker's error, on every worker (`Runtime.gather_errors`)."""
    return _runtime(strategy).gather_errors(error)


def same_settings(settings: Mapping[str, Any], owner: str, strategy: Any | None = None) -> None:
    """Raises on every worker if `settings` differ between workers (`Runtime.same_settings`)."""
    _runtime(strategy).same_settings(settings, owner)
