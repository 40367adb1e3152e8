"""The active backend's package, handed to the backend-free folders.

`cluster/`, `runtime/`, `io/`, `callbacks/`, `samplers/`, `inputs/` and `devices` never
import `keras_mgpu_plugins.backends`: the backend packages build on them (a runtime is a
`runtime.Runtime`, a GPU reader a `samplers.gpu.GPUMemory`), so an import back would tie
the whole package into one import circle. Instead the dispatcher (`backends.current`)
hands itself in here when it is imported (`provide`), which the package's `__init__` does
first thing, before any of kmp's code can run; the backend-free code asks `active()` for
the package of the running Keras backend and calls the functions every backend package
offers (`backends`' docstring).

`require_keras` lives here too: importing Keras, with an error naming kmp's extras when
its backend's framework is missing, is something every folder may need first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

#: The frameworks behind Keras's backends, and kmp's extra that installs each.
_EXTRAS = {"tensorflow": "tensorflow", "jax": "jax", "jaxlib": "jax", "torch": "torch"}

#: Each Keras backend's lane, as kmp's messages and docs name it.
LANES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}

_dispatch: list[Callable[[], ModuleType]] = []


def provide(current: Callable[[], ModuleType]) -> None:
    """Hands in the dispatcher: `current()` returns the active backend's package."""
    _dispatch[:] = [current]


def active() -> ModuleType:
    """The backend package of the active Keras backend (`keras.backend.backend()`).

    Raises:
        RuntimeError: If no dispatcher was handed in (the package's `__init__` does it, so
            only a partial import of kmp can get here without one).
    """
    if not _dispatch:
        raise RuntimeError(
            "keras_mgpu_plugins.backends was not imported, so kmp cannot reach the active "
            "Keras backend. Import keras_mgpu_plugins (its __init__ imports it) before "
            "calling kmp's parts.")
    return _dispatch[0]()


def lane() -> str:
    """The lane of the active Keras backend, as messages name it (`"TensorFlow"`, `"JAX"`,
    `"torch"`; another backend by Keras's own name)."""
    name = require_keras().backend.backend()
    return LANES.get(name, name)


def require_keras() -> ModuleType:
    """`import keras`, with an error naming kmp's extras when its backend is not installed.

    Raises:
        ImportError: If Keras's backend framework (`KERAS_BACKEND`, default
            TensorFlow) is missing.
    """
    try:
        import keras
    except ModuleNotFoundError as err:
        if err.name not in _EXTRAS:
            raise
        backend = os.environ.get("KERAS_BACKEND", "tensorflow (Keras's default)")
        extra = _EXTRAS[err.name]
        fix = f'pip install "keras_mgpu_plugins[{extra}]"'
        raise ImportError(
            f"Keras's backend is {backend}, but {err.name!r} is not installed. Install it "
            f"({fix}), or choose an installed backend with KERAS_BACKEND. kmp's lanes: "
            'pip install "keras_mgpu_plugins[tensorflow]" (tf.distribute), '
            'pip install "keras_mgpu_plugins[jax]" with KERAS_BACKEND=jax (keras.distribution) or '
            'pip install "keras_mgpu_plugins[torch]" with KERAS_BACKEND=torch (one process per '
            "device, DistributedDataParallel)."
        ) from err
    return keras
