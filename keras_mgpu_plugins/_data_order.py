"""The order in which kmp feeds the running `fit` its rows, where kmp feeds it itself.

kmp's own feeding of arrays (several processes: `inputs.batches.global_batches`)
draws one permutation of the global rows per pass over the data, from a seed the processes
share and the pass's number. The feeding of a `fit` that shuffles registers itself here
(`register`); `kmp.callbacks.BackupAndRestore` records its `state()` at each epoch's start
and gives it back (`restore`) when it resumes, so that the resumed epochs see the rows in
the order the uninterrupted run would have, whatever seed the new `fit` drew.

An order is an object with `state() -> dict` (JSON values, with `"rows"`: how many) and
`restore(state)`. No backend import here.
"""

from __future__ import annotations

from typing import Any, Protocol


class Order(Protocol):
    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...


_current: list[Any] = [None]


def register(order: Order | None) -> None:
    """`order` feeds the `fit` about to run (`None`: none kmp feeds)."""
    _current[0] = order


def current() -> Order | None:
    """The order registered last, if any."""
    return _current[0]
