"""`integrations.ray`: the refusal of a Ray Train group kmp would not train as one job (a pure
decision), and the worker's identity outside Ray (no Ray imported, none asked)."""

from __future__ import annotations

import sys

import pytest

from keras_mgpu_plugins import _stop_signals
from keras_mgpu_plugins.integrations import ray as ray_train


@pytest.mark.parametrize("world_size, num_workers, backend, group", [
    (1, 1, "jax", False), (2, 2, "tensorflow", False), (2, 2, "torch", True),
    (2, 2, "jax", False)])
def test_a_group_kmp_sees_whole_is_accepted(world_size, num_workers, backend, group):
    assert ray_train.refusal(world_size, 0, num_workers, backend, group) is None


def test_workers_kmp_does_not_see_as_one_job_are_refused_naming_what_ray_supports():
    """JaxTrainer on CPUs: Ray starts no jax.distributed there; each worker alone."""
    reason = ray_train.refusal(2, 1, 1, "jax", False)
    assert reason.startswith("This is worker 1 of a Ray Train group of 2, but kmp sees 1 worker")
    assert "JaxTrainer starts jax.distributed on TPUs and GPUs only" in reason
    assert "TensorflowTrainer sets TF_CONFIG" in reason and '".[tensorflow,ray]"' in reason


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_torch_trainer_without_keras_on_torch_is_refused_naming_the_fix(backend):
    reason = ray_train.refusal(2, 0, 2, backend, True)
    assert f"but Keras runs on {backend}" in reason
    assert "KERAS_BACKEND=torch" in reason and '".[torch,ray]"' in reason


def test_outside_ray_train_nothing_is_asked_and_nothing_watched(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray.train", raising=False)
    assert ray_train.world() is None
    assert ray_train.watch_preemption() is None
    ray_train.check_job(1, "tensorflow")  # no error


def test_a_watched_notice_is_a_stop_request_until_undone():
    notices = iter([None, "Ray's preemption notice (ranks [1])"])
    undo = _stop_signals.watch(lambda: next(notices))
    try:
        assert _stop_signals.requested() is None
        request = _stop_signals.requested()
        assert request is not None and request.name == "Ray's preemption notice (ranks [1])"
        assert _stop_signals.name(request.signum) == "SIGTERM"
    finally:
        undo()
    assert _stop_signals.requested() is None


@pytest.mark.parametrize("raw, expected", [(None, 1), ("1", 1), ("4", 4)])
def test_ray_is_asked_at_each_check_unless_told_otherwise(raw, expected):
    environ = {} if raw is None else {ray_train.CHECK_EVERY_ENV: raw}
    assert ray_train.check_every(environ) == expected


@pytest.mark.parametrize("raw", ["0", "-2", "often", "1.5"])
def test_a_check_every_that_is_no_whole_number_is_refused_naming_it(raw):
    with pytest.raises(ValueError, match=(
            rf"KMP_RAY_PREEMPTION_CHECK_EVERY must be a whole number >= 1 \(1: Ray's preemption "
            rf"notice is asked at each of BackupAndRestore's checks\). Received: "
            rf"KMP_RAY_PREEMPTION_CHECK_EVERY='{raw}'")):
        ray_train.check_every({ray_train.CHECK_EVERY_ENV: raw})


def test_a_watched_source_is_asked_at_every_check_even_once_a_request_is_held():
    """A source may be a collective (Ray's notice is a barrier over the group): every worker
    asks it as often as the others, whatever it already holds; the first notice stands."""
    asked = []

    def source():
        asked.append(len(asked))
        return f"notice {len(asked)}"

    undo = _stop_signals.watch(source)
    try:
        for _ in range(3):
            request = _stop_signals.requested()
        assert asked == [0, 1, 2] and request.name == "notice 1"
    finally:
        undo()
