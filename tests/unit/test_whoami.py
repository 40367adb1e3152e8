"""`collective.whoami` in one process: the environment's plan until kmp gives a strategy."""

from __future__ import annotations

import json

import pytest

from keras_mgpu_plugins import collective

SRUN_TASK_2_OF_4 = {"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_STEP_ID": "0",
                    "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "4"}


@pytest.fixture
def env(monkeypatch):
    for name in ("TF_CONFIG", *SRUN_TASK_2_OF_4):
        monkeypatch.delenv(name, raising=False)
    collective.forget_for_tests()
    yield monkeypatch
    collective.forget_for_tests()


def test_before_any_strategy_the_environment_answers(env):
    assert collective.whoami() == (0, 1, True)
    for name, value in SRUN_TASK_2_OF_4.items():
        env.setenv(name, value)
    assert collective.whoami() == (2, 4, False)
    cluster = {"chief": ["a:1"], "worker": ["b:1"], "evaluator": ["c:1"]}
    env.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 0}}))
    assert collective.whoami() == (0, 2, False)  # an evaluator is never the chief


def test_a_single_worker_strategy_from_kmp_makes_this_process_its_own_chief(env):
    from keras_mgpu_plugins.backends.tensorflow.strategy import get_strategy

    for name, value in SRUN_TASK_2_OF_4.items():
        env.setenv(name, value)
    get_strategy("default")  # srun -n 4 of a strategy="default" script: four independent runs
    assert collective.whoami() == (0, 1, True)
    assert (collective.is_chief(), collective.worker_index(), collective.num_workers()) == (True, 0, 1)
