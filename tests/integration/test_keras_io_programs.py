"""keras.io example programs train on 2 devices and 2 workers as on one device.

Each program of `tests/programs` (five keras.io examples, small and seeded) is
trained as its author wrote it (plain Keras, one device) and adapted as README.md
says (`@kmp.parallelize` on the factory, kmp's callbacks) on 2 simulated devices, in
a fresh process that calls `kmp.simulate_devices(2)` first as a user's script does.
With SGD and with the program's own optimizer, the weights after `fit`, every
History key and the final `evaluate` must agree within 1e-5, or within ten times
the program's float noise where that is larger: the same program on one device with
the rows of each batch reversed, measured with

    PYTHONPATH=. python -m tests.programs.harness --noise

(weights, Keras 3.15.1, TensorFlow 2.21, this repository's 2-core CI machine:
mnist_convnet 3.0e-8 / 3.0e-8, vision_transformer 1.2e-7 / 3.3e-5 with AdamW,
knowledge_distillation 1.5e-8 / 3.0e-8, text_transformer 6.0e-8 / 1.3e-7,
feature_space 3.0e-8 / 1.6e-7; SGD / the program's optimizer). Two of the programs
also run on 2 workers (`kmp.launch`, real processes).
"""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.programs import OPTIMIZERS, PROGRAMS, harness

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5
NOISE_TOLERANCE = {("vision_transformer", "program"): 10 * 3.3e-5}  # AdamW's noise, above

# Where a batch repeats an Embedding row (the text transformer's tokens), Keras 3's Adam-family
# optimizers square each repeated row's slices on one device: plain Keras is then off the dense
# gradient's update, and kmp, which sums the rows first on 1 and N devices
# (sum_duplicate_sparse_gradient_rows, docs/distribution_matrix.md), is compared with the
# program adapted on one device; plain Keras's own difference is asserted to be there.
KMP_ONE_DEVICE = {("text_transformer", "program")}
CASES = [pytest.param(name, optimizer, id=f"{name}-{optimizer}")
         for name in PROGRAMS for optimizer in OPTIMIZERS]
ON_WORKERS = [("mnist_convnet", "program"), ("feature_space", "program")]  # the cheapest


def _env() -> dict[str, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO_ROOT)}
    for name in ("TF_CONFIG", "KMP_LAUNCH_WORKER", "KMP_NUM_WORKERS", "KMP_WORKER_INDEX"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory) -> dict:
    """Every case, trained in one fresh process with 2 simulated devices."""
    out = tmp_path_factory.mktemp("programs") / "two_devices.pkl"
    done = subprocess.run([sys.executable, "-m", "tests.programs.harness", "--two-devices",
                           str(out)], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True,
                          timeout=420)
    assert done.returncode == 0, done.stderr[-5000:]
    with open(out, "rb") as f:
        return pickle.load(f)


@pytest.fixture(scope="module")
def one_device():
    """The plain Keras run of a case, in this process, each made once."""
    runs: dict = {}

    def run(name: str, optimizer: str, parallel: bool | str = False) -> dict:
        if (name, optimizer, parallel) not in runs:
            runs[name, optimizer, parallel] = harness.train(name, optimizer, parallel=parallel)
        return runs[name, optimizer, parallel]

    return run


def assert_same_run(got: dict, want: dict, atol: float) -> None:
    assert "error" not in got, got.get("error")
    difference = harness.largest_difference(got, want)
    assert difference["weights"] <= atol, difference
    assert got["history"].keys() == want["history"].keys()
    for key, values in want["history"].items():
        np.testing.assert_allclose(got["history"][key], values, rtol=0, atol=atol, err_msg=key)
    assert got["evaluate"].keys() == want["evaluate"].keys()
    for key, value in want["evaluate"].items():
        np.testing.assert_allclose(got["evaluate"][key], value, rtol=0, atol=atol, err_msg=key)


@pytest.mark.parametrize(("name", "optimizer"), CASES)
def test_two_devices_train_as_one_device(name, optimizer, two_devices, one_device):
    reference = "default" if (name, optimizer) in KMP_ONE_DEVICE else False
    assert_same_run(two_devices[name, optimizer], one_device(name, optimizer, reference),
                    NOISE_TOLERANCE.get((name, optimizer), TOLERANCE))


@pytest.mark.parametrize(("name", "optimizer"), sorted(KMP_ONE_DEVICE))
def test_plain_keras_is_off_the_dense_update_where_a_batch_repeats_an_embedding_row(
        name, optimizer, one_device):
    """Why those cases compare with kmp on one device: plain Keras differs from it there
    (Adam squares each repeated row's slices); drop the case from KMP_ONE_DEVICE when not."""
    difference = harness.largest_difference(one_device(name, optimizer),
                                            one_device(name, optimizer, "default"))
    assert difference["weights"] > 1e-4, difference


@pytest.mark.multi_worker
def test_two_workers_train_as_one_device(one_device):
    workers = kmp.launch(harness.on_each_worker, num_workers=2, args=(ON_WORKERS,), timeout=400)
    for case in ON_WORKERS:
        for worker in workers:
            assert_same_run(worker[case], one_device(*case), TOLERANCE)
        for a, b in zip(workers[0][case]["weights"], workers[1][case]["weights"], strict=True):
            assert np.array_equal(a, b), case
        assert workers[0][case]["history"] == workers[1][case]["history"], case
