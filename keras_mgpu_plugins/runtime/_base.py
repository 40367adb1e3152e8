"""`Runtime`: the collectives callbacks run, built on a backend's rank and `all_gather`."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import numpy as np

from keras_mgpu_plugins._progress import note_progress
from keras_mgpu_plugins._step_phases import CLOCK

T = TypeVar("T")

#: Bytes of an error's text (`"Type: message"`) that travel between workers.
CAUSE_BYTES = 240
#: Length of `encode_error`'s vector.
ERROR_WIDTH = CAUSE_BYTES + 1


class Rank(NamedTuple):
    """Where this process stands in the job it trains in."""

    worker_index: int
    num_workers: int
    is_chief: bool


class PeerFailedError(RuntimeError):
    """Raised on the workers where a step succeeded when it failed on another one."""


class SettingsDifferError(ValueError):
    """A callback was created with different arguments on different workers."""


class Runtime:
    """Who this process is in its job, and the collectives every worker runs.

    A backend implements `rank`, `spans_workers` and `_gather`; the rest is
    shared. Every collective must be called by every worker, in the same
    order, with vectors of the same shape and dtype.
    """

    def rank(self) -> Rank:
        """This process's rank, number of workers and chief flag, read at call time."""
        raise NotImplementedError

    @property
    def spans_workers(self) -> bool:
        """Whether the collectives communicate with other processes."""
        raise NotImplementedError

    def _gather(self, wire: np.ndarray) -> np.ndarray:
        """Every worker's `wire` (int64 or float64), stacked; called only when spanning."""
        raise NotImplementedError

    def store(self) -> Any:
        """The job's key-value store (`runtime.calls.Store`), or `None` where the backend has
        none to offer: the calls check (`runtime.calls.together`) is then skipped."""
        return None

    @property
    def is_chief(self) -> bool:
        return self.rank().is_chief

    @property
    def worker_index(self) -> int:
        return self.rank().worker_index

    @property
    def num_workers(self) -> int:
        return self.rank().num_workers

    def all_gather(self, vector: Any) -> np.ndarray:
        """Gathers one array from every worker, stacked in worker order.

        Args:
            vector: An array-like; same shape and dtype on every worker. Floating
                values travel as float64, integers and booleans as int64 (exact).

        Returns:
            An array of shape `(num_workers, *vector.shape)`, of `vector`'s dtype.
        """
        array = np.asarray(vector)
        if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
            wire = array.astype(np.int64)
        else:
            wire = array.astype(np.float64)
        if not self.spans_workers:
            return wire[None].astype(array.dtype) if array.dtype != np.bool_ else array[None]
        note_progress()  # a collective entered and left are progress (StallWatchdog)
        with CLOCK.in_collective():  # a wait for the others, not host work (DeviceMetricsLogger)
            gathered = self._gather(wire)
        note_progress()
        return gathered.astype(np.bool_) if array.dtype == np.bool_ else gathered.astype(array.dtype)

    def agree(self, flag: bool, how: str = "any") -> bool:
        """One boolean decision every worker holds: `"any"` vote true, `"all"`, or the `"chief"`'s."""
        if how not in ("any", "all", "chief"):
            raise ValueError(f'how must be "any", "all" or "chief". Received: how={how!r}')
        votes = self.all_gather(np.array([bool(flag)]))[:, 0]
        if how == "chief":
            return bool(votes[0])
        return bool(votes.any() if how == "any" else votes.all())

    def broadcast(self, value: Any, root: int = 0) -> np.ndarray:
        """The `root` worker's array (default: the chief's), on every worker."""
        return self.all_gather(value)[root]

    def barrier(self) -> None:
        """Returns once every worker has called it."""
        self.all_gather(np.zeros(1, np.int64))

    def together(self, action: Callable[[], T], what: str) -> T:
        """Runs `action()` here; raises on every worker, with the cause, if it raised on any.

        The worker where `action` raised re-raises its own error; the others raise
        `PeerFailedError` naming `what`, the failing workers and their errors
        (type and message, the first `CAUSE_BYTES` bytes of each). One all-gather
        of each worker's error text when spanning workers, nothing otherwise.

        Raises:
            PeerFailedError: On the workers where `action` succeeded, if it raised
                on another, e.g. `"the step failed (worker 1: KeyError: 'only here').
                Every worker stops here."`.
        """
        if not self.spans_workers:
            return action()
        error: BaseException | None = None
        result: Any = None
        try:
            result = action()
        except Exception as err:  # noqa: BLE001 - raised below, once every worker knows
            error = err
        failed = self.gather_errors(error)
        if error is not None:
            raise error
        if failed is not None:
            raise PeerFailedError(f"{what} failed ({failed}). Every worker stops here.")
        return result

    def gather_errors(self, error: BaseException | None) -> str | None:
        """Every worker's error, on every worker: `"worker 1: KeyError: 'x'; ..."`, or `None`.

        One all-gather of `encode_error(error)` when spanning workers; otherwise
        this process's `"Type: message"`, or `None`.
        """
        if not self.spans_workers:
            return None if error is None else f"{type(error).__name__}: {error}"
        views = self.all_gather(encode_error(error))
        causes = [(i, decode_error(row)) for i, row in enumerate(views)]
        return "; ".join(f"worker {i}: {cause}" for i, cause in causes if cause is not None) or None

    def same_settings(self, settings: Mapping[str, Any], owner: str) -> None:
        """Raises on every worker if `settings` differ between workers.

        A callback whose arguments decide when it runs a collective (`save_freq`,
        `patience`, ...), created differently on two workers, would run a
        different number of collectives there, and the job would hang at the
        first one a worker skips. One all-gather of one CRC-32 per setting (of its
        `repr`) when spanning workers; nothing otherwise.

        Raises:
            SettingsDifferError: On every worker, naming the settings that differ
                from the chief's, this worker's values and the workers that differ.
        """
        differ = self.settings_differ(settings)
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

    def settings_differ(self, settings: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The settings whose value differs from the chief's, each with the workers where it does.

        The same answer on every worker: one all-gather of one CRC-32 per setting (of its
        `repr`) when spanning workers; `{}` otherwise.
        """
        if not self.spans_workers:
            return {}
        names = sorted(settings)
        digests = np.array([zlib.crc32(repr(settings[n]).encode()) for n in names], np.int64)
        gathered = self.all_gather(digests)
        differ = {n: np.flatnonzero(gathered[:, i] != gathered[0, i]) for i, n in enumerate(names)}
        return {n: ranks for n, ranks in differ.items() if ranks.size}

    def gather_texts(self, text: str) -> list[str]:
        """Every worker's `text` (UTF-8), in worker order: two all-gathers (lengths, bytes)."""
        data = text.encode()
        lengths = self.all_gather(np.array([len(data)]))[:, 0]
        padded = np.zeros(int(lengths.max()), np.int64)
        padded[:len(data)] = np.frombuffer(data, np.uint8)
        rows = self.all_gather(padded)
        return [bytes(row[:int(n)].astype(np.uint8)).decode() for row, n in
                zip(rows, lengths, strict=True)]

    def describe(self) -> dict[str, Any]:
        """How the model is distributed, for experiment records (backend-provided keys)."""
        return {"strategy": "default", "devices": []}

    @property
    def replicas_in_sync(self) -> int:
        """Replicas of the model across every worker (one copy of each variable per replica)."""
        return 1

    def track(self, variables: list, optimizer_vars: list, statistics: Any, key: tuple) -> Any:
        """This worker's copies of the variables `WeightSyncVerifier` checks (backend-provided)."""
        import keras

        raise NotImplementedError(
            f"kmp.callbacks.WeightSyncVerifier reads the replicas' copies of each variable, which "
            f"the {keras.backend.backend()} backend does not provide to kmp yet. Use it with "
            "KERAS_BACKEND=tensorflow, or leave it out.")

    def scope(self) -> contextlib.AbstractContextManager:
        """Where variables are created as the model's (e.g. an optimizer built late)."""
        return contextlib.nullcontext()

    def across_workers(self) -> Runtime:
        """This runtime, or one over the process's multi-worker job if the model's spans one
        worker only (a model built outside the job's strategy still checks against the job)."""
        return self


class SingleProcess(Runtime):
    """One process training alone: rank 0 of 1, the chief; every collective is the identity."""

    def rank(self) -> Rank:
        return Rank(0, 1, True)

    @property
    def spans_workers(self) -> bool:
        return False

    def track(self, variables: list, optimizer_vars: list, statistics: Any, key: tuple) -> Any:
        """One process on one device: each variable is its own only copy, nothing to compare
        (`WeightSyncVerifier` then checks nothing, as on one TensorFlow device)."""
        return _OneCopyEach(key)


class _OneCopyEach:
    """The tracked variables of a one-device process: one replica, no copies to compare."""

    def __init__(self, key: tuple) -> None:
        self.key, self.replicas = key, 1
        self.paths: list[str] = []
        self.roles: list[str] = []
        self.copies: list[tuple] = []


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
