"""One TensorFlow worker may do what one device does; a call that needs every worker, made on
one, is an error on every waiting worker within seconds, never a hang (2 workers, kmp.launch).

Without the check (feature `same_calls_on_every_worker`), the chief's lone `evaluate` fails
after about 12 s with "UnavailableError: Collective ops is aborted by: ... tasks are unhealthy"
once the other worker ends, and hangs while the other worker calls `predict`.
"""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.multi_worker import calls_job

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(240)]


def test_the_chief_alone_exports_saves_loads_predicts_and_trains_a_loaded_model(tmp_path):
    chief, other = kmp.launch(calls_job.chief_alone, num_workers=2, args=(str(tmp_path),),
                              timeout=180)
    assert "loaded_predict" not in other
    np.testing.assert_allclose(chief["predict"], other["predict"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(chief["loaded_predict"], chief["predict"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(chief["exported_predict"], chief["predict"], atol=1e-6, rtol=0)
    assert "Trainable params: 21" in chief["summary"]
    for have, want in zip(chief["loaded_trained"], chief["reference_trained"], strict=True):
        np.testing.assert_allclose(have, want, atol=1e-6, rtol=0)  # one device, there
    assert chief["loaded_evaluate"] == pytest.approx(chief["reference_evaluate"], abs=1e-6)
    assert chief["seconds"] < 60  # no wait for the other worker


def test_evaluate_on_one_worker_while_the_other_ends_raises_at_once():
    chief, other = kmp.launch(calls_job.one_calls_alone, num_workers=2, args=("ended",),
                              timeout=180)
    assert other["error"] == "no error"
    assert chief["error"].startswith("CallsDifferError: evaluate(...) of a model kmp "), chief
    assert "process 1: ended its script after 1 such calls" in chief["error"]
    assert "process 0: sequential" in chief["error"] and "calls_job.py:" in chief["error"]
    assert chief["seconds"] < 10, chief  # before TensorFlow's own error (about 12 s)


def test_different_calls_on_the_workers_raise_on_every_worker():
    results = kmp.launch(calls_job.one_calls_alone, num_workers=2, args=("other",), timeout=180)
    for found in results:
        message = found["error"]
        assert message.startswith("CallsDifferError:"), message
        assert "process 0: sequential" in message and ".evaluate(...) at calls_job.py:" in message
        assert "process 1: sequential" in message and ".predict(...) at calls_job.py:" in message
        assert found["seconds"] < 10, found
