"""The JAX lane's tests: skipped as a whole unless JAX is importable and Keras runs on JAX.

Each test that needs a device count or several processes runs `tests/jax/program.py`
in fresh processes (JAX reads its device count once, when its backend starts).
"""

from __future__ import annotations

import importlib.util


def _on_jax() -> bool:
    if importlib.util.find_spec("jax") is None:
        return False
    import keras

    return keras.backend.backend() == "jax"


collect_ignore_glob = [] if _on_jax() else ["test_*.py"]


if _on_jax():
    import keras
    import pytest

    @pytest.fixture(autouse=True)
    def no_distribution():
        """Each test starts and ends with no Keras distribution set in this process."""
        keras.distribution.set_distribution(None)
        yield
        keras.distribution.set_distribution(None)
