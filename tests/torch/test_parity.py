"""Two torch processes (torchrun's variables, gloo) against one device on the same global
batches: weights within 1e-5 (SGD, Adam, no shuffle, seeded), History the same on every
process, predict every row once in order, partial and uneven batches, every input kind.

One start of the two processes runs every scenario (`cases.suite`), one process the
one-device reference: starting torch and Keras costs seconds each.
"""

from __future__ import annotations

import json

import pytest

from tests.torch import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(400)]

SCENARIOS = [
    ["parity", {"optimizer": "sgd"}],
    ["parity", {"optimizer": "adam"}],
    ["parity", {"optimizer": "adamw", "rows": 9, "batch": 2}],
    ["parity", {"optimizer": "sgd", "batchnorm": True, "sync_batchnorm": True}],
    ["parity", {"optimizer": "sgd", "batchnorm": True}],
    ["shuffled", {"mode": "true"}],
    ["shuffled", {"mode": "batch"}],
    ["inputs", {"kind": "dict"}],
    ["inputs", {"kind": "pydataset"}],
    ["inputs", {"kind": "generator"}],
    ["inputs", {"kind": "dataloader"}],
    ["inputs", {"kind": "class_weight"}],
    ["inputs", {"kind": "four_parts", "rows": 24}],
    ["refused_loader", {}],
]
TOLERANCE = 1e-5


def key(name: str, kwargs: dict) -> str:
    return f"{name}({json.dumps(kwargs, sort_keys=True)})"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every scenario on 2 processes, then on one device (shuffled runs as Keras shuffles)."""
    folder = tmp_path_factory.mktemp("parity")
    many = helpers.run_processes(folder, "tests.torch.cases:suite", {"scenarios": SCENARIOS})
    reference = [[name, kwargs] for name, kwargs in SCENARIOS if name != "refused_loader"]
    one = helpers.run_one(folder, "tests.torch.cases:suite", {"scenarios": reference})
    found = {}
    for (name, kwargs), (ref_name, ref_kwargs) in zip(
            [s for s in SCENARIOS if s[0] != "refused_loader"], reference, strict=True):
        found[key(name, kwargs)] = (many[0][key(name, kwargs)], many[1][key(name, kwargs)],
                                    one[key(ref_name, ref_kwargs)])
    found["refused_loader"] = (many[0][key("refused_loader", {})],
                               many[1][key("refused_loader", {})])
    return found


def weights(result: dict) -> list:
    return [result[k] for k in sorted(result) if k[0] == "w" and k[1:].isdigit()]


def check_equal_to_one_device(runs, name: str, kwargs: dict, one_device: bool = True) -> None:
    rank0, rank1, one = runs[key(name, kwargs)]
    assert helpers.max_diff(weights(rank0), weights(rank1)) == 0.0  # one model
    assert rank0["history"] == rank1["history"]  # the same logs on every process
    for name_ in ("predict", "evaluate", "predict_small"):
        if name_ in rank0:
            assert helpers.max_diff([rank0[name_]], [rank1[name_]]) == 0.0
    if not one_device:
        return
    assert helpers.max_diff(weights(rank0), weights(one)) < TOLERANCE
    mine, theirs = json.loads(rank0["history"]), json.loads(one["history"])
    assert set(mine) == set(theirs)
    for metric, values in theirs.items():
        assert len(mine[metric]) == len(values)
        assert max(abs(a - b) for a, b in zip(mine[metric], values, strict=True)) < 1e-5
    for name_ in ("predict", "evaluate", "predict_small"):
        if name_ in one:
            assert rank0[name_].shape == one[name_].shape  # every row once, in order
            assert helpers.max_diff([rank0[name_]], [one[name_]]) < TOLERANCE


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fit_evaluate_predict_equal_one_device_with_partial_and_uneven_batches(runs, optimizer):
    check_equal_to_one_device(runs, "parity", {"optimizer": optimizer})


def test_a_last_batch_of_one_row_on_two_processes(runs):
    """9 rows, batch 2: a last batch with fewer rows than processes (gloo's 'collective
    mismatch' upstream) is trained whole on each, counted once."""
    check_equal_to_one_device(runs, "parity", {"optimizer": "adamw", "rows": 9, "batch": 2})


def test_sync_batchnorm_equals_one_device(runs):
    check_equal_to_one_device(runs, "parity", {"optimizer": "sgd", "batchnorm": True,
                                               "sync_batchnorm": True})


def test_batchnorm_default_keeps_one_model_with_per_process_statistics(runs):
    """DDP's default: each process normalises its own rows; the moving statistics are rank
    0's on every process (as DDP broadcasts its buffers), so the weights stay identical."""
    check_equal_to_one_device(runs, "parity", {"optimizer": "sgd", "batchnorm": True},
                              one_device=False)
    rank0, _, one = runs[key("parity", {"optimizer": "sgd", "batchnorm": True})]
    assert helpers.max_diff(weights(rank0), weights(one)) > TOLERANCE  # other statistics


@pytest.mark.parametrize("mode", ["true", "batch"])
def test_shuffle_is_one_devices_permutation_each_epoch(runs, mode):
    """Keras's own `fit(shuffle=...)` on one device, seeded alike: the same weights, so the
    processes trained on one device's global batches (kmp draws the order as Keras does)."""
    rank0, rank1, _ = runs[key("shuffled", {"mode": mode})]
    assert (rank0["orders"] == rank1["orders"]).all()
    for order in rank0["orders"]:
        assert sorted(order.tolist()) == list(range(len(order)))  # every row once
    assert len({tuple(o) for o in rank0["orders"].tolist()}) == len(rank0["orders"])
    check_equal_to_one_device(runs, "shuffled", {"mode": mode})


@pytest.mark.parametrize("kind", ["dict", "pydataset", "generator", "dataloader",
                                  "class_weight"])
def test_every_input_kind_equals_one_device(runs, kind):
    check_equal_to_one_device(runs, "inputs", {"kind": kind})


def test_a_dataloader_of_four_part_batches_equals_one_device(runs):
    """A GAN's batches (x, y, noise, weights), unpacked by the model's own train_step: Keras's
    own fit takes them from a DataLoader; kmp served them through a PyDataset, whose adapter
    refused them ("PyDataset.__getitem__() must return a tuple or a dict")."""
    check_equal_to_one_device(runs, "inputs", {"kind": "four_parts", "rows": 24})


def test_a_dataloader_that_shards_itself_is_refused_naming_what_to_pass(runs):
    for result in runs["refused_loader"]:
        assert "DistributedSampler" in result["error_text"]
        assert "Pass the same DataLoader on every process" in result["error_text"]


def test_upstream_ddp_where_keras_has_it_else_kmps_own_averaging(runs):
    """keras-nightly (keras-team/keras#23316) wraps the model in DistributedDataParallel in
    fit: kmp uses it (and weights each process's loss for uneven batches); Keras 3.10 to 3.15
    have none: kmp averages the gradients itself. Both equal one device (above)."""
    import keras

    rank0, rank1, _ = runs[key("parity", {"optimizer": "sgd"})]
    expected = "DistributedDataParallel" if "dev" in keras.__version__ else "kmp"
    assert rank0["engine"] == rank1["engine"] == expected
