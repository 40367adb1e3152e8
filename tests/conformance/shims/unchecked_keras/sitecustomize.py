"""Makes the installed Keras report a release kmp has not checked (a pre-release of the next
minor), for the conformance table's version-policy row: `PYTHONPATH=<this folder>`.

Everything else of Keras is the installed release: only its version number changes, in
`keras.__version__`, `keras.version()` and the package metadata.
"""

import importlib.abc
import importlib.metadata
import sys

_real_version = importlib.metadata.version


def _pretend() -> str:
    major, minor = _real_version("keras").split(".")[:2]
    return f"{major}.{int(minor) + 1}.0.dev2026112900"


def _version(name):
    return _pretend() if name.lower() == "keras" else _real_version(name)


importlib.metadata.version = _version


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in ("keras", "keras.src.version"):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            module.__version__ = _pretend()

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
