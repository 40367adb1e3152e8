"""`when_imported(name, then)`: run `then(module)` once a module is imported, without importing it.

A launcher worker must not import Keras before the user's code does: the script
may choose `KERAS_BACKEND` or split the devices first, and `kmp.launch(...,
create_strategy=False)` promises a bootstrap without TensorFlow. Yet every
`fit` of the job must get the launcher's `StallWatchdog`: the patch goes on
right after Keras's own `__init__` has run, wherever the import happens.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


def when_imported(name: str, then: Callable[[ModuleType], Any]) -> None:
    """Calls `then(module)` now if module `name` is imported, else right after its import.

    Errors of `then` raise here when called now; after an import they are turned into
    a warning, so that the user's `import` itself never fails because of `then`.
    """
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds `name` through the other finders, and makes its loader call `then` afterwards.

    It stays in `sys.meta_path` until the module is executed: a mere look-up
    (`importlib.util.find_spec`, as TensorFlow does for Keras) is not an import.
    """

    def __init__(self, name: str, then: Callable[[ModuleType], Any]) -> None:
        self.name, self.then = name, then
        self._searching = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or getattr(self._searching, "now", False):
            return None
        self._searching.now = True  # the search below must not come back here
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching.now = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            if self not in sys.meta_path:  # called already (two imports raced)
                return
            sys.meta_path.remove(self)
            try:
                self.then(module)
            except Exception as err:  # noqa: BLE001 - never fail the user's import
                warnings.warn(f"kmp: after importing {fullname}: {type(err).__name__}: {err}",
                              RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_module  # this spec's own loader object
        return spec
