"""Undecorated training on several processes is refused on every lane, before the first
step, on every process, with one message naming the lane; a model on one process alone, or
under the job's own distribution, trains (`runtime.apart`)."""

from __future__ import annotations

import importlib.util

import keras
import pytest

import keras_mgpu_plugins as kmp
from tests.lanes import jobs

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(300)]

LANES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}


def assert_refused(text: str, rank: int, lane: str) -> None:
    assert text.startswith(f"SeparateModelsError: This process is rank {rank} of 2 processes "
                           f"on the {LANES[lane]} lane, but "), text
    assert "would train a separate model on each process" in text
    assert "@kmp.parallelize" in text and "or run one process" in text
    assert text.endswith("[steps 0]"), text  # refused before the first step


def test_undecorated_fit_with_callbacks_is_refused_on_every_process(job_env, tmp_path):
    results = kmp.launch(jobs.separate_models, num_workers=2, args=(str(tmp_path),),
                         timeout=240)
    for rank, found in enumerate(results):
        assert_refused(found["kmp_callbacks"], rank, job_env)
        assert_refused(found["keras_callbacks"], rank, job_env)  # kmp joined the job: its hook
        assert found["no_callbacks"] == "trained"  # this process's own model, as one device
        assert found["decorated"] == "trained"
        assert found.get("job_strategy", "trained") == "trained"
    assert not (tmp_path / "plain.csv").exists()
    mechanism = {"tensorflow": "MultiWorkerMirroredStrategy", "jax": "jax.distributed",
                 "torch": "torch's process group"}
    for rank, found in enumerate(results):  # Keras's own writers: the lane's words
        refused = found["keras_checkpoint"]
        assert refused.startswith(f"ValueError: model.fit on several workers ({LANES[job_env]} "
                                  "lane) was given keras.callbacks.ModelCheckpoint"), refused
        assert all((m in refused) == (lane == job_env) for lane, m in mechanism.items())
        assert refused.endswith("[steps 0]") and f"Received (worker {rank})" in refused
        if importlib.util.find_spec("tensorflow") is None:  # Keras's TensorBoard needs it
            assert found["tensorboard"].startswith(
                "ModuleNotFoundError: keras.callbacks.TensorBoard writes its event files with "
                f"TensorFlow's tf.summary on every Keras backend (Keras {keras.__version__} "
                f"imports tensorflow.summary in it, on the {LANES[job_env]} lane too), and "
                "tensorflow"), found["tensorboard"]
            assert "pip install tensorflow-cpu" in found["tensorboard"]
            assert found["tensorboard"].endswith("[steps 0]")
        else:
            assert found["tensorboard"] == "trained"
    assert results[0]["chief_alone"] == "trained" and "chief_alone" not in results[1]
    assert results[0]["chief_alone_diff"] == 0.0  # a loaded model on one process: one device


def test_kmp_callbacks_refuse_before_the_job_is_joined(job_env, tmp_path):
    results = kmp.launch(jobs.kmp_callbacks_only, num_workers=2, args=(str(tmp_path),),
                         timeout=240, create_strategy=False, stall_timeout=None)
    for rank, found in enumerate(results):
        assert_refused(found["kmp_callbacks"], rank, job_env)
        assert found["keras_callbacks"] == "trained"  # kmp was not asked: plain Keras
    assert not (tmp_path / "m.keras").exists()
