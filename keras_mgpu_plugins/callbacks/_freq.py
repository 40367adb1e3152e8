"""Keras's idiom for how often a callback acts: `*_freq="epoch" | int` (batches).

One parser for every callback's frequency argument, and the one-release bridge
from the older names (`log_every_n_batches`, `every_n_batches`, ...).
"""

from __future__ import annotations

import warnings
from typing import Any

#: Marks an argument the caller did not pass (distinct from `None`).
UNSET: Any = object()


def batches_between(name: str, value: Any, batch: bool = False) -> int:
    """Batches between two actions: 0 for `"epoch"` (at epoch ends only), else `value`.

    Args:
        name: The argument's name, for the message.
        value: What the caller passed.
        batch: Also accept `"batch"` (every batch: 1), as W&B's Keras callbacks do.

    Raises:
        ValueError: Unless `value` is `"epoch"` (or `"batch"`, where accepted)
            or a positive int (naming `name`).
    """
    if value == "epoch":
        return 0
    if batch and value == "batch":
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        valid = '"epoch", "batch"' if batch else '"epoch"'
        raise ValueError(f"{name} must be {valid} or a positive integer (a number of batches). "
                         f"Received: {name}={value!r}")
    return value


def renamed(owner: str, old: str, old_value: Any, new: str, new_value: Any, default: Any) -> Any:
    """The value of `new`, taking a deprecated `old` argument's value for one release.

    Warns with a `DeprecationWarning` when `old` is passed (`old_value` is not
    `UNSET`); raises `ValueError` when both are.
    """
    if old_value is UNSET:
        return default if new_value is UNSET else new_value
    if new_value is not UNSET:
        raise ValueError(f"{owner}: pass {new} only ({old} is its deprecated name). "
                         f"Received: {new}={new_value!r}, {old}={old_value!r}")
    warn_renamed(owner, old, new, stacklevel=4)
    return old_value


def warn_renamed(owner: str, old: str, new: str, stacklevel: int = 3) -> None:
    """Warns (`DeprecationWarning`) that `owner`'s argument `old` is now `new`."""
    warnings.warn(f"{owner}({old}=...) is deprecated and will be removed in the next release; "
                  f"use {new}=... instead.", DeprecationWarning, stacklevel=stacklevel)
