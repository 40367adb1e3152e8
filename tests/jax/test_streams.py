"""A `keras.utils.PyDataset` and a generator on 2 JAX processes (`kmp.launch`): the same input
on every process, each fed its share of every batch, equal to one device on the same global
batches (fit with validation_data, evaluate, predict: every row once, in order); a process
whose input differs raises on every process, naming the input and the batch."""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.jax import helpers, streams_job

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(300)]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def jax_env():
    with pytest.MonkeyPatch.context() as patch:
        for key, value in helpers.environment().items():
            patch.setenv(key, value)
        yield


@pytest.fixture(scope="module")
def parities(jax_env):
    return kmp.launch(streams_job.every_parity, num_workers=2, timeout=240)


@pytest.fixture(scope="module")
def errors(jax_env):
    return kmp.launch(streams_job.every_error, num_workers=2, timeout=240)


@pytest.mark.parametrize("case", ["/".join(map(str, c)) for c in streams_job.CASES])
def test_trains_evaluates_predicts_as_one_device(parities, case):
    first, second = (p[case] for p in parities)
    assert first == second  # identical History, weights, results on both processes
    got, want = first["processes"], first["reference"]
    assert got["history"].keys() == want["history"].keys()
    assert "val_loss" in got["history"]
    for key, values in want["history"].items():
        np.testing.assert_allclose(got["history"][key], values, atol=TOLERANCE, rtol=0, err_msg=key)
    for have, expected in zip(got["weights"], want["weights"], strict=True):
        np.testing.assert_allclose(have, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(got["evaluate"], want["evaluate"], atol=TOLERANCE, rtol=0)
    rows = int(case.split("/")[-1])  # 29: a last batch of 5 rows, fed whole to both devices
    assert np.shape(got["predict"]) == (rows, 1)  # every row once, in order
    np.testing.assert_allclose(got["predict"], want["predict"], atol=TOLERANCE, rtol=0)


def test_a_tf_data_dataset_trains_evaluates_predicts_as_one_device(jax_env):
    """Where TensorFlow is installed beside JAX: the user's tf.data input, read in order on
    every process (its passes as Keras reads them), each process fed its share."""
    pytest.importorskip("tensorflow")
    results = kmp.launch(streams_job.tf_data_parity, num_workers=2, timeout=240)
    assert results[0] == results[1]
    for optimizer in ("sgd", "adam"):
        got, want = results[0][optimizer]["processes"], results[0][optimizer]["reference"]
        assert "val_loss" in got["history"]
        for key, values in want["history"].items():
            np.testing.assert_allclose(got["history"][key], values, atol=TOLERANCE, rtol=0)
        for have, expected in zip(got["weights"], want["weights"], strict=True):
            np.testing.assert_allclose(have, expected, atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(got["evaluate"], want["evaluate"], atol=TOLERANCE, rtol=0)
        assert np.shape(got["predict"]) == (streams_job.ROWS, 1)
        np.testing.assert_allclose(got["predict"], want["predict"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_shuffle_permutes_a_py_datasets_batches_the_same_way_on_every_process(parities, optimizer):
    first, second = (p[f"shuffled/{optimizer}"] for p in parities)
    assert first == second  # the same batch order asked for, History and weights identical
    count = streams_job.ROWS // streams_job.BATCH
    orders = [first["asked"][-(streams_job.EPOCHS - e) * count:][:count]
              for e in range(streams_job.EPOCHS)]
    assert all(sorted(o) == list(range(count)) for o in orders)  # every batch once per pass
    assert orders[0] != orders[1] or orders[0] != list(range(count))  # shuffled
    for have, expected in zip(first["weights"], first["reference"], strict=True):
        np.testing.assert_allclose(have, expected, atol=TOLERANCE, rtol=0)  # one device's order
    for key, values in first["reference_history"].items():
        np.testing.assert_allclose(first["history"][key], values, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("kind", ["generator", "PyDataset"])
def test_a_process_whose_input_differs_raises_on_every_process(errors, kind):
    for found in errors:
        rows, length = found[kind]["rows"], found[kind]["length"]
        assert rows.startswith("InputsDifferError: fit(x=...): batch 2 differs"), rows
        assert "same seeds" in rows
        assert length.startswith("InputsDifferError: evaluate(x=...)"), length
        if kind == "generator":
            assert "process 1: no batch 3 (its input ended)" in length
        else:
            assert "4 batches" in length and "3 batches" in length


def test_inputs_kmp_cannot_split_name_what_to_pass(errors):
    for found in errors:
        refused = found["refusals"]
        assert "use_multiprocessing=False" in refused["multiprocessing"]
        assert "list_iterator" in refused["iterator"]
        assert "PyDataset, generator, tf.data.Dataset, grain dataset" in refused["iterator"]
