"""`backends.current()`: the one way kmp reaches a Keras backend, handed to the backend-free
package as `_backend.active()`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(code: str, backend: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_a_missing_backend_names_the_extras():
    done = run("""
        import keras_mgpu_plugins as kmp
        assert kmp.topology().num_workers == 1      # no Keras needed
        try:
            kmp.callbacks.ModelCheckpoint
        except ImportError as err:
            print(err)
        """, "torch")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Keras's backend is torch, but 'torch' is not installed" in done.stdout
    assert 'pip install "keras_mgpu_plugins[jax]" with KERAS_BACKEND=jax' in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="Keras's numpy backend imports jax")
def test_a_backend_without_distributed_fit_refuses_to_distribute():
    done = run("""
        import keras_mgpu_plugins as kmp
        build = kmp.parallelize(lambda: "the model")
        print(build())
        for bad in ({"strategy": "mirrored"}, {"sync_batchnorm": True}):
            try:
                kmp.parallelize(**bad)
            except NotImplementedError as err:
                print(err)
        print(kmp.runtime.of().is_chief, kmp.runtime.of().agree(True))
        try:
            kmp.simulate_devices(2)
        except NotImplementedError as err:
            print(err)
        """, "numpy")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "the model"
    assert lines[1].startswith("Keras has no distributed fit on the 'numpy' backend")
    assert "strategy='mirrored'" in lines[1] and "KERAS_BACKEND=jax" in lines[1]
    assert lines[2].startswith("Keras has no distributed fit on the 'numpy' backend")
    assert lines[3] == "True True"
    assert lines[4].startswith("kmp.simulate_devices(2) splits a device")


def test_the_backend_free_package_receives_the_dispatcher_on_import():
    done = run("""
        import keras_mgpu_plugins.io.atomic  # any part: the package's __init__ runs first
        from keras_mgpu_plugins import _backend, backends
        assert _backend.active() is backends.current(), (_backend.active(), backends.current())
        _backend._dispatch.clear()
        try:
            _backend.active()
        except RuntimeError as err:
            print(err)
        """, next(b for b in ("tensorflow", "jax", "torch") if importlib.util.find_spec(b)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "keras_mgpu_plugins.backends was not imported" in done.stdout
