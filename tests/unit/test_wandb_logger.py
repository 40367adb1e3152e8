"""WandbLogger's decisions, tested with numbers: steps, aliases, names, batch sizes, arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest

from keras_mgpu_plugins.integrations import wandb as kmp_wandb
from keras_mgpu_plugins.integrations._wandb_logic import (
    StepCounter,
    batch_sizes,
    checkpoint_aliases,
    format_group_id,
    worker_run_name,
)
from keras_mgpu_plugins.integrations.wandb import WandbLogger


@pytest.mark.parametrize(("log_freq", "expected"), [("epoch", 0), ("batch", 1), (1, 1), (25, 25)])
def test_batches_between_logs(log_freq, expected):
    assert WandbLogger(log_freq=log_freq).log_every == expected


@pytest.mark.parametrize("log_freq", [0, -3, 2.5, True, "step", None])
def test_bad_log_freq_is_refused_in_init(log_freq):
    with pytest.raises(ValueError, match=r'log_freq must be "epoch", "batch" or a positive '
                                         r"integer \(a number of batches\). Received: log_freq="):
        WandbLogger(log_freq=log_freq)


def test_bad_mode_and_config_are_refused_in_init():
    with pytest.raises(ValueError, match=r'"chief" or "group". Received: mode=\'all\''):
        WandbLogger(mode="all")
    with pytest.raises(ValueError, match=r"Received: config=\[1\]"):
        WandbLogger(config=[1])


def test_init_keeps_wandb_init_arguments():
    logger = WandbLogger(project="p", entity="e", name="n", mode="group", tags=["t"], dir="/x")
    assert logger.init_kwargs == {
        "project": "p", "entity": "e", "name": "n", "tags": ["t"], "dir": "/x",
    }
    assert logger.mode == "group" and logger.group is None and logger.log_every == 0
    # no batch hook unless batch logs are asked for (Keras dispatches faster without one)
    assert "on_train_batch_end" not in vars(WandbLogger(log_freq="epoch"))
    assert "on_train_batch_end" in vars(WandbLogger(log_freq=3))


def test_worker_run_names_and_group_ids():
    assert worker_run_name(None, 0) == "run-worker0"
    assert worker_run_name("mnist", 3) == "mnist-worker3"
    assert format_group_id(255) == "kmp-00000000000000ff"
    assert format_group_id(2**62 - 1) == "kmp-3fffffffffffffff"


def test_checkpoint_aliases_follow_keras_epoch_numbering():
    payload = {"path": "m.keras", "epoch": 0, "batch": None, "is_best": False}
    assert checkpoint_aliases(payload) == ["latest", "epoch-1"]
    assert checkpoint_aliases({**payload, "epoch": 4, "is_best": True}) == [
        "latest", "epoch-5", "best",
    ]


def test_batch_sizes_from_replica_counts():
    # 2 replicas on this worker saw 4 rows each over 1 batch; 4 replicas in the job
    assert batch_sizes([4.0, 4.0], 1, 4) == {"global_batch_size": 16, "per_replica_batch_size": 4}
    # after 3 batches (steps_per_execution=3)
    assert batch_sizes([24.0], 3, 1) == {"global_batch_size": 8, "per_replica_batch_size": 8}
    assert batch_sizes([0.0, 0.0], 1, 2) == {}  # nothing counted (custom train_step)
    assert batch_sizes([5.0], 0, 1) == {}


def test_steps_are_global_batches_done():
    steps = StepCounter(steps_per_epoch=4)
    steps.begin_epoch(0)
    assert [steps.at(batch=b) for b in range(4)] == [1, 2, 3, 4]
    assert steps.at() == 4  # epoch end shares the last batch's step
    steps.begin_epoch(1)
    assert steps.at(batch=1) == 6 and steps.at() == 8
    assert steps.at(epoch=0) == 4  # a late event for epoch 0 keeps its step


def test_resumed_fit_continues_the_global_batch_count():
    steps = StepCounter(steps_per_epoch=10)
    steps.begin_epoch(3)  # fit(initial_epoch=3)
    assert steps.at(batch=0) == 31 and steps.at() == 40


def test_active_run_with_later_step_is_never_stepped_back():
    steps = StepCounter(steps_per_epoch=5, start=100)  # the user already logged up to 100
    steps.begin_epoch(0)
    assert steps.at(batch=0) == 101 and steps.at() == 105
    steps.begin_epoch(1)
    assert steps.at() == 110


def test_unknown_steps_per_epoch_stays_monotonic():
    steps = StepCounter(steps_per_epoch=None)
    steps.begin_epoch(0)
    assert steps.at() == 1  # no batch seen: one step per epoch
    steps.begin_epoch(1)
    assert [steps.at(batch=b) for b in range(3)] == [2, 3, 4]
    assert steps.at() == 4
    steps.begin_epoch(2)
    assert steps.at() == 5


def test_missing_wandb_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r'pip install "keras_mgpu_plugins\[wandb\]"'):
        WandbLogger()
    with pytest.raises(ImportError, match=r"keras_mgpu_plugins\[wandb\]"):
        kmp_wandb.require_wandb()


def test_package_imports_without_wandb_and_the_logger_module_does_not_import_it():
    code = (
        "import sys\n"
        "import keras_mgpu_plugins, keras_mgpu_plugins.integrations.wandb as w\n"
        "assert 'wandb' not in sys.modules, 'imported eagerly'\n"
        "sys.modules['wandb'] = None\n"
        "import keras_mgpu_plugins.integrations._wandb_records\n"
        "try:\n"
        "    w.WandbLogger()\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert 'pip install "keras_mgpu_plugins[wandb]"' in out.stdout
