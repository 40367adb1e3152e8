"""Shared test setup.

The test process splits its CPU into 2 logical devices before TensorFlow starts,
so single-process tests can use `MirroredStrategy` over 2 replicas
(`kmp.parallelize(strategy="mirrored")`) beside ordinary one-device tests. With
`KMP_TESTS_REAL_DEVICES=1` (the GPU run's tests, `tests/gpu`) it does not: the tests
see the machine's devices as they are.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.pop("TF_CONFIG", None)  # a stray cluster would change every test

NUM_SIMULATED_DEVICES = 2
#: Set by the GPU run (benchmarks/gpu/run.py) for its tests: real devices, `gpu` tests on.
REAL_DEVICES = "KMP_TESTS_REAL_DEVICES"


def pytest_configure(config):
    import keras

    import keras_mgpu_plugins as kmp

    if os.environ.get(REAL_DEVICES) == "1":
        return
    if keras.backend.backend() in ("tensorflow", "jax"):  # the backends with distributed fit
        kmp.simulate_devices(NUM_SIMULATED_DEVICES)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only in the GPU run (`KMP_TESTS_REAL_DEVICES=1`), where they
    skip themselves without a GPU unless it is the run's CPU dry run."""
    if os.environ.get(REAL_DEVICES) == "1":
        return
    import pytest

    skip = pytest.mark.skip(reason="needs a GPU: run by benchmarks/gpu/run.py "
                                   f"({REAL_DEVICES}=1)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _stop_signal_handlers_put_back():
    """Each test ends with the stop signals' handlers it began with, none armed: a `fit` with
    `BackupAndRestore` that raised (what many tests provoke) leaves kmp's handlers set until
    that callback's next `fit`, and a later test's SIGTERM would be taken for a stop request."""
    import signal

    signums = [s for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)]
    before = {s: signal.getsignal(s) for s in signums}
    yield
    from keras_mgpu_plugins import _stop_signals

    _stop_signals.disarm()
    for s, handler in before.items():
        if handler is not None and signal.getsignal(s) is not handler:
            signal.signal(s, handler)
