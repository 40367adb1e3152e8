"""One JAX process may do what one device does; a call that needs every process, made on one,
is an error on every waiting process within seconds, never a hang (2 processes, kmp.launch)."""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.jax import calls_job, helpers

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(240)]


@pytest.fixture
def jax_env(monkeypatch):
    for key, value in helpers.environment().items():
        monkeypatch.setenv(key, value)


def test_the_chief_alone_saves_loads_predicts_and_trains_a_loaded_model(jax_env, tmp_path):
    chief, other = kmp.launch(calls_job.chief_alone, num_workers=2, args=(str(tmp_path),),
                              timeout=180)
    assert chief["topology"] == [0, True] and "topology" not in other  # kmp.topology(): rank
    assert chief["predict"] == other["predict"]
    np.testing.assert_allclose(chief["loaded_predict"], chief["predict"], atol=1e-6, rtol=0)
    for have, want in zip(chief["loaded_trained"], chief["reference_trained"], strict=True):
        np.testing.assert_allclose(have, want, atol=1e-6, rtol=0)  # one device, there
    assert chief["seconds"] < 60  # no wait for the other process (it hung forever before)


def test_evaluate_on_one_process_while_the_other_ends_raises_at_once(jax_env):
    chief, other = kmp.launch(calls_job.one_calls_alone, num_workers=2, args=("ended",),
                              timeout=180)
    assert other["error"] == "no error"
    assert chief["error"].startswith("CallsDifferError: evaluate(...) of a model kmp "), chief
    assert "process 1: ended its script after 1 such calls" in chief["error"]
    assert "process 0: sequential" in chief["error"] and "calls_job.py:" in chief["error"]
    assert chief["seconds"] < 30


def test_different_calls_on_the_processes_raise_on_every_process(jax_env):
    results = kmp.launch(calls_job.one_calls_alone, num_workers=2, args=("other",), timeout=180)
    for found in results:
        message = found["error"]
        assert message.startswith("CallsDifferError:"), message
        assert ".evaluate(...) at calls_job.py:" in message
        assert ".predict(...) at calls_job.py:" in message
        assert found["seconds"] < 30
