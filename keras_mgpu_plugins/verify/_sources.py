"""The random sources a verify run cannot seed, as the script's own code reads them.

Each run starts from one seed (Python's `random`, NumPy's global generator, the backend's:
`keras.utils.set_random_seed`), so a script that draws from those draws the same numbers
in every run. A generator seeded from the operating system (`numpy.random.default_rng()`,
`random.Random()`, `random.seed()` with no seed, `os.urandom`) draws other numbers in each
run: the runs cannot be compared, and the report names the call. The clock (`time.time`)
is noted only: scripts read it to time themselves; it is named as a likely reason where
the runs' data or initial weights differ.

Only calls made by the user's code are noted: a file outside the standard library, the
installed packages and kmp.
"""

from __future__ import annotations

import functools
import os
import random
import sys
import sysconfig
import time
from typing import Any

#: What the script's code read, in order: `"numpy.random.default_rng() without a seed at
#: train.py:12"`.
UNSEEDABLE: list[str] = []
CLOCK: list[str] = []
_installed: list[bool] = []


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # kmp itself
    return tuple(os.path.realpath(r) + os.sep for r in roots)


_ROOTS: tuple[str, ...] = ()


def user_site(depth: int) -> str | None:
    """`"file:line"` of the frame `depth` levels above the caller, if it is the user's code."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return None
    filename = frame.f_code.co_filename
    if filename.startswith("<") or os.path.realpath(filename).startswith(_ROOTS):
        return None
    return f"{os.path.basename(filename)}:{frame.f_lineno}"


def _noting(original: Any, what: str, into: list[str], unseeded: Any, depth: int = 1) -> Any:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if unseeded(args, kwargs):
            site = user_site(depth)
            if site is not None and len(into) < 20:
                into.append(f"{what} at {site}")
        return original(*args, **kwargs)

    return call


def _no_seed(args: tuple, kwargs: dict) -> bool:
    return (args[0] if args else kwargs.get("seed", kwargs.get("a"))) is None


def install() -> None:
    """Notes, from now on, every unseedable source the user's code reads. Idempotent."""
    global _ROOTS
    if _installed:
        return
    _installed.append(True)
    _ROOTS = _library_roots()
    import numpy as np

    np.random.default_rng = _noting(np.random.default_rng, "numpy.random.default_rng() "
                                    "without a seed", UNSEEDABLE, _no_seed)
    np.random.seed = _noting(np.random.seed, "numpy.random.seed() without a seed",
                             UNSEEDABLE, _no_seed)
    random.seed = _noting(random.seed, "random.seed() without a seed", UNSEEDABLE, _no_seed)
    # random.Random() seeds itself through Random.seed, called from Random.__init__.
    init = random.Random.__init__

    @functools.wraps(init)
    def random_init(self: Any, x: Any = None) -> None:
        if x is None and type(self) is random.Random:
            site = user_site(1)
            if site is not None and len(UNSEEDABLE) < 20:
                UNSEEDABLE.append(f"random.Random() without a seed at {site}")
        init(self, x)

    random.Random.__init__ = random_init  # type: ignore[method-assign]
    os.urandom = _noting(os.urandom, "os.urandom()", UNSEEDABLE, lambda a, k: True)
    for name in ("time", "time_ns"):
        setattr(time, name, _noting(getattr(time, name), f"the clock (time.{name}())", CLOCK,
                                    lambda a, k: True))
