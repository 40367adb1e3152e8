"""The lane under test is the active Keras backend; each test's workers get that lane's
environment (`job_env`)."""

from __future__ import annotations

import pytest

#: Variables of a job this test process must not pass on to the jobs it starts.
_JOB_PREFIXES = ("TF_CONFIG", "KERAS_DISTRIBUTION_", "SLURM_", "KMP_", "WORLD_SIZE", "RANK",
                 "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def lane() -> str:
    """The active Keras backend: `"tensorflow"`, `"jax"` or `"torch"`."""
    import keras

    return keras.backend.backend()


@pytest.fixture
def job_env(monkeypatch, lane):
    """The workers' environment: no job variables of this process's, and on JAX one CPU
    device per process (the 2 devices this test process simulates are its own)."""
    import os

    for name in list(os.environ):
        if name.startswith(_JOB_PREFIXES):
            monkeypatch.delenv(name)
    if lane == "jax":
        monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
        monkeypatch.delenv("XLA_FLAGS", raising=False)
        monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    if lane == "torch":
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return lane
