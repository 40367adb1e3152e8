"""The torch backend's tests: skipped as a whole unless torch is importable and Keras runs on
torch (`KERAS_BACKEND=torch`). Keras has no distributed `fit` on torch: kmp's callbacks run
in one process there, and `@kmp.parallelize` refuses to distribute."""

from __future__ import annotations

import importlib.util


def _on_torch() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import keras

    return keras.backend.backend() == "torch"


collect_ignore_glob = [] if _on_torch() else ["test_*.py"]
