"""Calls every worker must make together: never a hang when one worker makes it alone.

`fit`, `evaluate` and `predict` of a model kmp distributed over several processes run
collectives, so every process must call them, in the same order. Code that runs on
one process only (`if kmp.topology().is_chief: model.evaluate(...)`) would leave that
process waiting forever in its first collective. So each such call first meets the
other processes in the job's key-value store (`Runtime.store()`: the coordination
service JAX's or TensorFlow's runtime already runs): process `p` posts the method and
call site of its `n`-th call, then waits until every process has posted its `n`-th. The
same method on every process: the call goes on. Another method, or a process that ended
its script: `CallsDifferError` on every process that is waiting, at once, naming each
process's call. A process that posts nothing for `timeout` seconds while the others wait
(it is busy elsewhere, or in a callback's nested call): the same error, naming what each
process posted last.

The backends call `together` before these methods: JAX for the models kmp built
(`backends/jax/methods.py`), TensorFlow for every model under a multi-worker strategy
(`backends/tensorflow/same_calls.py`). Plain Keras calls (saving, loading, a model loaded
on one process, a model under no distribution spanning processes) are not counted: they
need no other process.
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
import time
from typing import Any, Protocol

#: Seconds a process waits for the others to reach the same call (`KMP_CALL_TIMEOUT`).
DEFAULT_TIMEOUT = 300.0
TIMEOUT_ENV = "KMP_CALL_TIMEOUT"
#: Seconds a process waits for the others before it asks whether one ended its script.
ENDED_AFTER = 0.2
_PREFIX = "kmp/calls"
_state = {"count": itertools.count(), "made": 0, "exit_hook": False}
_lock = threading.Lock()


class CallsDifferError(RuntimeError):
    """The processes did not make the same call (one process called alone)."""


class StoreUnreachableError(RuntimeError):
    """A backend's store cannot reach the job's key-value store any more (the process that
    holds it ended or failed); `together` raises `CallsDifferError` from it."""


class Store(Protocol):
    """The job's key-value store, as a backend gives it (`Runtime.store()`)."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> str | None: ...

    def dir(self, prefix: str) -> dict[int, str]:
        """The values under `prefix`, by the last part of their key (a process index)."""


def together(runtime: Any, method: str, model: Any) -> None:
    """Waits until every process of `runtime` makes its next call of `fit`/`evaluate`/`predict`
    (this one); nothing where the runtime spans one process or has no store.

    Raises:
        CallsDifferError: On every waiting process, as described in the module docstring.
    """
    if not runtime.spans_workers:
        return
    client = runtime.store()
    if client is None:  # the installed backend hides its store: no check (one warning said so)
        return
    with _lock:
        n = next(_state["count"])
        _state["made"] = n + 1
        if not _state["exit_hook"]:
            atexit.register(_post_end, client, runtime.worker_index)
            _state["exit_hook"] = True
    rank = runtime.rank()
    me, count = rank.worker_index, rank.num_workers
    name, site = getattr(model, "name", type(model).__name__), _call_site()
    try:
        client.set(f"{_PREFIX}/{n}/{me}", f"{method}|{name}|{site}")
        posted = _wait(client, n, count, me)
    except StoreUnreachableError as err:  # the process holding the store is gone
        here = f"process {me}: {name}.{method}(...) at {site}; {err}"
        raise CallsDifferError(_message(method, n, count, here)) from None
    methods = {p: v.split("|")[0] for p, v in posted.items()}
    if len(set(methods.values())) > 1:
        raise CallsDifferError(_differ(method, n, posted, client, count))


def timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds. Received: "
                         f"{TIMEOUT_ENV}={raw!r}") from None
    return value


def _wait(client: Any, n: int, count: int, me: int) -> dict[int, str]:
    """Every process's post for call `n`; raises when one ended before it, or at the timeout.

    Whether a process ended is asked only after `ENDED_AFTER` seconds of waiting: calls made
    within that time of each other never ask (on TensorFlow each absent key asked for costs a
    short wait and stays open in the service until it is set: `backends.tensorflow.store`).
    """
    start = time.monotonic()
    limit, pause = start + timeout(), 0.001
    while True:
        posted = _dir(client, f"{_PREFIX}/{n}/")
        if len(posted) == count:
            return posted
        now = time.monotonic()
        ended = {p: int(v) for p, v in _dir(client, f"{_PREFIX}/end/").items()
                 if int(v) <= n} if now - start > ENDED_AFTER or now > limit else {}
        if ended or now > limit:
            raise CallsDifferError(_differ(posted.get(me, "?").split("|")[0], n, posted,
                                           client, count, ended))
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _differ(method: str, n: int, posted: dict[int, str], client: Any, count: int,
            ended: dict[int, int] | None = None) -> str:
    ended = ended or {}
    lines = []
    for p in range(count):
        if p in posted:
            what, name, site = (posted[p].split("|") + ["", ""])[:3]
            lines.append(f"process {p}: {name}.{what}(...) at {site}")
        elif p in ended:
            lines.append(f"process {p}: ended its script after {ended[p]} such calls")
        else:
            last = _last_post(client, p, n)
            lines.append(f"process {p}: not there after {timeout():.0f} s ({last})")
    return _message(method, n, count, "; ".join(lines))


def _message(method: str, n: int, count: int, differs: str) -> str:
    return (f"{method}(...) of a model kmp distributed over {count} processes must be "
            f"called by every process, in the same order (it runs collectives); call {n + 1} "
            f"differs: {differs}. Make such calls on every process (only their "
            "output on the chief: kmp.topology().is_chief); for work on one process, load "
            "the model there (keras.models.load_model, outside any strategy scope). "
            f"{TIMEOUT_ENV} sets the wait ({DEFAULT_TIMEOUT:.0f} s by default).")


def _last_post(client: Any, process: int, n: int) -> str:
    for k in range(n - 1, -1, -1):
        value = _get(client, f"{_PREFIX}/{k}/{process}")
        if value is not None:
            what, name, site = (value.split("|") + ["", ""])[:3]
            return f"its last call was {name}.{what}(...) at {site}"
    return "it made no such call yet"


def _dir(client: Store, prefix: str) -> dict[int, str]:
    return client.dir(prefix)


def _get(client: Store, key: str) -> str | None:
    return client.get(key)


def _post_end(client: Store, me: int) -> None:
    """At exit: how many calls this process made (the others stop waiting for more)."""
    try:
        client.set(f"{_PREFIX}/end/{me}", str(_state["made"]))
    except Exception:  # noqa: BLE001, S110 - the service may be gone already at exit
        pass


def _call_site() -> str:
    """The user's line that made the call (the first frame outside Keras, kmp and keras-hub)."""
    frame = sys._getframe(2)
    skip = ("keras_mgpu_plugins", os.sep + "keras" + os.sep, "keras_hub", "contextlib",
            "functools")
    while frame is not None and any(part in frame.f_code.co_filename for part in skip):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
