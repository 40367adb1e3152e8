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


#: `full`: `python -m pytest` without a path runs every test, as with `tests` given.
TIER = "KMP_TESTS_TIER"


def _fast_tier_only(config) -> bool:
    """No path, no `-m`, no `-k` given (README's command 2): the fast tier alone (`tests/tiers.py`)."""
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and not config.option.markexpr and not config.option.keyword
            and os.environ.get(TIER, "fast") != "full" and os.environ.get(REAL_DEVICES) != "1")


def _backend() -> str:
    import keras

    return keras.backend.backend()


def pytest_ignore_collect(collection_path, config):
    """The fast tier collects its own files only (and none of another lane's)."""
    if not _fast_tier_only(config) or collection_path.is_dir():
        return None
    from tests import tiers

    relative = collection_path.relative_to(config.rootpath).as_posix()
    if relative.startswith("tests/") and collection_path.name.startswith("test_"):
        return relative not in tiers.fast_tier_files(_backend()) or None
    return None


def pytest_report_header(config):
    if _fast_tier_only(config):
        return (f"the fast tier of the {_backend()} lane (tests/tiers.py); every test: "
                "python -m pytest -q tests")
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks the fast tier's tests `fast` (and keeps them alone without a path: README's
    command 2). Tests marked `gpu` run only in the GPU run (`KMP_TESTS_REAL_DEVICES=1`), where
    they skip themselves without a GPU unless it is the run's CPU dry run."""
    from tests import tiers

    backend = _backend()
    for item in items:
        if tiers.in_fast_tier(item.nodeid, backend):
            item.add_marker(pytest.mark.fast)
    if _fast_tier_only(config):
        deselected = [item for item in items if item.get_closest_marker("fast") is None]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if item.get_closest_marker("fast") is not None]
    if os.environ.get(REAL_DEVICES) == "1":
        return

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
