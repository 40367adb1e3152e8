"""Fine-tuning (keras.io's transfer-learning recipe, `tests/transfer_learning_recipe.py`) on JAX:
2 simulated devices and 2 processes train as one device.

The recipe compiles again outside the factory, with an optimizer made in the `compile(...)`
call (Adam(1e-5), or SGD over a schedule) and, with `require_compiled=False`, compiles the
first time outside too: kmp compiles under the model's distribution and lays the
optimizer's variables out, so `iterations`, weights and History are one device's.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests import transfer_learning_recipe as recipe
from tests.jax import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(900)]
CASES = [("schedule", True), ("adam", True), ("schedule", False)]
SCRIPT = """
import pickle, sys
import keras_mgpu_plugins as kmp
from tests import transfer_learning_recipe as recipe
from tests.jax.test_fine_tuning import CASES
if int(sys.argv[2]) > 1:
    kmp.simulate_devices(int(sys.argv[2]))
cases = {case: recipe.run(sys.argv[3], *case) for case in CASES}
pickle.dump(cases, open(sys.argv[1], "wb"))
"""


def run_in_process(tmp_path, devices: int, strategy: str) -> dict:
    out = tmp_path / f"{devices}.pkl"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(devices), strategy],
                          cwd=helpers.ROOT, env=helpers.environment(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    with open(out, "rb") as f:
        return pickle.load(f)


def on_processes() -> dict:
    return {case: recipe.run("auto", *case) for case in CASES}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jax_fine_tuning")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in helpers.environment().items():
            patch.setenv(key, value)
        processes = kmp.launch(on_processes, num_workers=2, timeout=600)
    return {"one": run_in_process(tmp, 1, "default"), "devices": run_in_process(tmp, 2, "auto"),
            "processes": processes}


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_the_fine_tuning_recipe_matches_one_device(runs, case):
    want = runs["one"][case]
    assert want["iterations"] == [8, 8]
    for name, got in [("2 devices", runs["devices"][case])] + [
            (f"process {i}", r[case]) for i, r in enumerate(runs["processes"])]:
        assert got["iterations"] == [8, 8], name
        assert recipe.max_difference(got["weights"], want["weights"]) < 1e-5, name
        assert got["same_optimizer"], name  # the model trains with the user's own object
        for mine, theirs in zip(got["histories"], want["histories"], strict=True):
            for key, values in theirs.items():
                np.testing.assert_allclose(mine[key], values, atol=1e-5, err_msg=f"{name} {key}")
    first, second = (r[case] for r in runs["processes"])
    assert json.dumps(first["histories"]) == json.dumps(second["histories"])
