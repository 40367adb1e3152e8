"""The few cross-worker primitives that callbacks need.

Callbacks never talk to `tf.distribute` or read `TF_CONFIG` themselves; they ask:

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

import zlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from keras_mgpu_plugins._progress import note_progress
from keras_mgpu_plugins._rank import (  # the one source of "who am I", re-exported
    Rank,
    _task_rank,
    _workers_in,
    check_env_agrees,
    forget_for_tests,
    note_strategy,
    spans_workers,
    whoami,
    workers_strategy,
)

__all__ = ["PeerFailedError", "Rank", "SettingsDifferError", "agree", "all_gather", "broadcast",
           "check_env_agrees", "forget_for_tests", "is_chief", "note_strategy", "num_workers",
           "same_settings", "spans_workers", "together", "whoami", "worker_index",
           "workers_strategy"]

T = TypeVar("T")


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
    """Gathers one array from every worker, stacked in worker order.

    Exact for every value: the vector travels through a sum all-reduce in which
    every other worker contributes zeros to its slot.

    Args:
        vector: An array-like; same shape and dtype on every worker. Floating
            values travel as float64, integers and booleans as int64.
        strategy: The strategy whose workers take part (default: the current).

    Returns:
        An array of shape `(num_workers, *vector.shape)`.
    """
    array = np.asarray(vector)
    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        wire = array.astype(np.int64)
    else:
        wire = array.astype(np.float64)
    if not spans_workers(strategy):
        return wire[None].astype(array.dtype) if array.dtype != np.bool_ else array[None]
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    workers = _workers_in(strategy)
    rank = _task_rank(strategy)
    slots = np.zeros((workers, *wire.shape), dtype=wire.dtype)
    slots[rank] = wire
    local = len(strategy.extended.worker_devices)
    zeros = np.zeros_like(slots)

    def value_fn(ctx: Any) -> Any:
        first_local = ctx.replica_id_in_sync_group % local == 0
        return tf.constant(slots if first_local else zeros)

    per_replica = strategy.experimental_distribute_values_from_function(value_fn)
    note_progress()  # a collective entered and left are progress (StallWatchdog)
    summed = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
    note_progress()
    return summed.astype(np.bool_) if array.dtype == np.bool_ else summed.astype(array.dtype)


def agree(flag: bool, strategy: Any | None = None, how: str = "any") -> bool:
    """One boolean decision that every worker holds after the call.

    Args:
        flag: This worker's vote.
        strategy: The strategy whose workers take part (default: the current).
        how: `"any"` (true if one worker votes true), `"all"`, or `"chief"`
            (the chief's vote).

    Returns:
        The same boolean on every worker.
    """
    if how not in ("any", "all", "chief"):
        raise ValueError(f'how must be "any", "all" or "chief". Received: how={how!r}')
    votes = all_gather(np.array([bool(flag)]), strategy)[:, 0]
    if how == "chief":
        return bool(votes[0])
    return bool(votes.any() if how == "any" else votes.all())


def broadcast(value: Any, strategy: Any | None = None, root: int = 0) -> np.ndarray:
    """The `root` worker's array (default: the chief's), on every worker."""
    return all_gather(value, strategy)[root]


class PeerFailedError(RuntimeError):
    """Raised on the workers where a step succeeded when it failed on another one."""


def together(action: Callable[[], T], what: str, strategy: Any | None = None) -> T:
    """Runs `action()` here; raises on every worker, with the cause, if it raised on any.

    The worker where `action` raised re-raises its own error; the others raise
    `PeerFailedError` naming `what`, the failing workers and their errors
    (type and message, the first `CAUSE_BYTES` bytes of each). One all-gather
    of each worker's error text when the strategy spans workers, nothing more
    otherwise: wrap a step whose failure on one worker (a chief-only write, a
    local read) would otherwise leave the others waiting in the next collective.

    Raises:
        PeerFailedError: On the workers where `action` succeeded, if it raised
            on another, e.g. `"the step failed (worker 1: KeyError: 'only here').
            Every worker stops here."`.
    """
    if not spans_workers(strategy):
        return action()
    error: BaseException | None = None
    result: Any = None
    try:
        result = action()
    except Exception as err:  # noqa: BLE001 - raised below, once every worker knows
        error = err
    failed = gather_errors(error, strategy)
    if error is not None:
        raise error
    if failed is not None:
        raise PeerFailedError(f"{what} failed ({failed}). Every worker stops here.")
    return result


#: Bytes of an error's text (`"Type: message"`) that travel between workers.
CAUSE_BYTES = 240
#: Length of `encode_error`'s vector.
ERROR_WIDTH = CAUSE_BYTES + 1


def encode_error(error: BaseException | None) -> np.ndarray:
    """`[n, byte...]` as float64, for a collective: `n` < 0 for no error, else its text's length."""
    vector = np.zeros(ERROR_WIDTH)
    if error is None:
        vector[0] = -1
        return vector
    text = f"{type(error).__name__}: {error}".encode()[:CAUSE_BYTES]
    vector[0] = len(text)
    vector[1 : 1 + len(text)] = np.frombuffer(text, dtype=np.uint8)
    return vector


def decode_error(vector: np.ndarray) -> str | None:
    """The text `encode_error` put in `vector`, or `None` for no error."""
    n = int(vector[0])
    if n < 0:
        return None
    return bytes(np.asarray(vector[1 : 1 + n]).astype(np.uint8)).decode(errors="replace")


def gather_errors(error: BaseException | None, strategy: Any | None = None) -> str | None:
    """Every worker's error, on every worker: `"worker 1: KeyError: 'x'; ..."`, or `None`.

    One all-gather of `encode_error(error)` when the strategy spans workers; in
    one process, nothing to gather: this process's `"Type: message"`, or `None`.
    """
    if not spans_workers(strategy):
        return None if error is None else f"{type(error).__name__}: {error}"
    views = all_gather(encode_error(error), strategy)
    causes = [(i, decode_error(row)) for i, row in enumerate(views)]
    return "; ".join(f"worker {i}: {cause}" for i, cause in causes if cause is not None) or None


class SettingsDifferError(ValueError):
    """A callback was created with different arguments on different workers."""


def same_settings(settings: Mapping[str, Any], owner: str, strategy: Any | None = None) -> None:
    """Checks that `settings` are the same on every worker; raises on every worker if not.

    A callback whose arguments decide when it runs a collective (`save_freq`,
    `patience`, `check_freq`, ...) would, created differently on two
    workers, run a different number of collectives there, and the job would
    hang at the first one that one worker skips. Calling this from
    `on_train_begin` turns that hang into an error naming the arguments.
    One all-gather of one CRC-32 per setting (of its `repr`) when the strategy
    spans workers; nothing otherwise.

    Args:
        settings: Argument names to values with a stable `repr` (numbers,
            strings, booleans, None, tuples of those).
        owner: What the settings belong to, for the message (e.g. the class name).
        strategy: The strategy whose workers take part (default: the current).

    Raises:
        SettingsDifferError: On every worker, naming the settings that differ
            from the chief's, this worker's values and the workers that differ.
    """
    if not spans_workers(strategy):
        return
    names = sorted(settings)
    digests = np.array([zlib.crc32(repr(settings[n]).encode()) for n in names], np.int64)
    gathered = all_gather(digests, strategy)
    differ = {n: np.flatnonzero(gathered[:, i] != gathered[0, i]) for i, n in enumerate(names)}
    differ = {n: ranks for n, ranks in differ.items() if ranks.size}
    if differ:
        details = "; ".join(
            f"{n} (here {settings[n]!r}; differs from the chief's on worker(s) "
            f"{', '.join(str(int(r)) for r in ranks)})" for n, ranks in differ.items()
        )
        raise SettingsDifferError(
            f"{owner} must be created with the same arguments on every worker: they decide "
            "where it runs collective operations, and a worker that runs fewer would leave "
            f"the others waiting. Differing: {details}."
        )
