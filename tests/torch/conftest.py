"""The torch backend's tests: skipped as a whole unless torch is importable and Keras runs on
torch (`KERAS_BACKEND=torch`). One process, and real 2-process jobs over gloo (`helpers`,
`kmp.launch`, `kmp-launch`, torchrun) against one device."""

from __future__ import annotations

import importlib.util


def _on_torch() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import keras

    return keras.backend.backend() == "torch"


collect_ignore_glob = [] if _on_torch() else ["test_*.py"]
