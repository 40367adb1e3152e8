"""`@kmp.parallelize` on JAX trains, evaluates and predicts as one device does.

2 simulated CPU devices in one process, and 2 real processes on localhost
(`jax.distributed` through `KERAS_DISTRIBUTION_*`), against plain Keras on one
device, same global batches: SGD, Adam, BatchNormalization, no shuffle, seeded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.jax import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(300)]
TOLERANCE = 1e-5
#: "partial_": 21/13/21/23 rows, batch_size=8 (BatchNormalization); "odd_": batch_size=5 (Adam).
RUNS = ("", "bn_", "adam_", "partial_", "odd_")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The reference, the 2-device and the 2-process runs, started together."""
    tmp = tmp_path_factory.mktemp("jax_parity")
    port = helpers.free_port()
    cases = [("reference", {}), ("devices", {})] + [
        ("processes", dict(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                           KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                           KERAS_DISTRIBUTION_PROCESS_ID=str(i))) for i in range(2)]
    outs = [tmp / f"{i}.npz" for i in range(len(cases))]
    processes = [helpers.start(case, out, **env) for (case, env), out in zip(cases, outs, strict=True)]
    reference, devices, *workers = helpers.finish(processes, outs)
    return {"reference": reference, "devices": devices, "workers": workers}


def candidates(runs):
    return [("2 devices", runs["devices"])] + [(f"process {i}", w) for i, w in enumerate(runs["workers"])]


@pytest.mark.parametrize("prefix", RUNS)
def test_weights_equal_one_device(runs, prefix):
    reference = runs["reference"]
    keys = helpers.weight_keys(reference, prefix + "w")
    assert keys
    for name, results in candidates(runs):
        for key in keys:
            np.testing.assert_allclose(results[key], reference[key], atol=TOLERANCE, rtol=0,
                                       err_msg=f"{name} {key}")


@pytest.mark.parametrize("prefix", RUNS)
def test_history_and_evaluate_equal_one_device(runs, prefix):
    expected = json.loads(str(runs["reference"][prefix + "history"]))
    first, second = (str(w[prefix + "history"]) for w in runs["workers"])
    assert first == second  # identical logs on both processes
    for name, results in candidates(runs):
        history = json.loads(str(results[prefix + "history"]))
        assert history.keys() == expected.keys()
        for key in expected:
            np.testing.assert_allclose(history[key], expected[key], atol=TOLERANCE, rtol=0,
                                       err_msg=f"{name} {key}")
        np.testing.assert_allclose(results[prefix + "evaluate"], runs["reference"][prefix + "evaluate"],
                                   atol=TOLERANCE, rtol=0, err_msg=name)


@pytest.mark.parametrize("prefix", RUNS)
def test_predict_returns_every_row_once_in_order(runs, prefix):
    expected = runs["reference"][prefix + "predict"]
    assert expected.shape == ((23, 1) if prefix in ("partial_", "odd_") else (24, 1))
    for name, results in candidates(runs):
        assert results[prefix + "predict"].shape == expected.shape, name
        np.testing.assert_allclose(results[prefix + "predict"], expected, atol=TOLERANCE, rtol=0,
                                   err_msg=name)


def test_a_batch_size_that_never_divides_warns_once_naming_it(runs):
    for name, results in candidates(runs):
        messages = [str(m) for m in results["odd_warnings"]]
        assert len(messages) == 1 and "batch_size=5" in messages[0], (name, messages)
        assert "multiple of 2" in messages[0] and "speed-up" in messages[0]


def test_runtime_collectives_across_two_processes(runs):
    for index, results in enumerate(runs["workers"]):
        assert results["rank"].tolist() == [index, 2, int(index == 0)]
        assert bool(results["spans"])
        np.testing.assert_array_equal(results["gathered_f"], [[0.5, 1e300, -2.25], [1.5, 1e300, -2.25]])
        assert results["gathered_i"].dtype == np.int64
        assert results["gathered_i"].tolist() == [[2**62, -7], [2**62 + 1, -7]]
        assert bool(results["agree_any"]) and not bool(results["agree_all"])
        assert results["broadcast"].tolist() == [10.0]
        assert int(results["replicas"]) == 2
        described = json.loads(str(results["describe"]))
        assert described["strategy"] == "DataParallel" and described["processes"] == 2
        assert len(described["devices"]) == 2


def test_runtime_in_one_process_with_two_devices(runs):
    results = runs["devices"]
    assert results["rank"].tolist() == [0, 1, 1] and not bool(results["spans"])
    assert results["gathered_f"].tolist() == [[0.5, 1e300, -2.25]]
    assert int(results["replicas"]) == 2
    assert json.loads(str(results["describe"]))["devices"] == ["cpu:0", "cpu:1"]


def test_inputs_kmp_cannot_split_are_refused_on_several_processes(runs):
    for results in runs["workers"]:
        assert str(results["error_shuffle"]) == "no error"  # one shuffle shared (test_shuffle.py)
        assert "list_iterator" in str(results["error_iterator"])  # generators: test_streams.py
        assert "numpy arrays" in str(results["error_iterator"])
        assert "PyDataset, generator, tf.data.Dataset, grain dataset" in str(results["error_iterator"])
    # one process: Keras assembles every global batch itself (its own shuffle), nothing to refuse
    assert str(runs["devices"]["error_shuffle"]) == "no error"
