"""The fit-settings matrix on JAX: 2 simulated devices and 2 processes (`kmp-launch -n 2`)
against one device in plain Keras (`tests/jax/matrix.py`), SGD and Adam.

float32 settings agree to 1e-5 (measured: at most 1.8e-7 on weights). Mixed precision
cannot: the devices' half-batch sums round differently. Its tolerance is the measured
noise of one device fed the same batches with each batch's rows reversed (the
`*_reversed` scenarios: 6.5e-4 bfloat16, 5.5e-5 float16 with SGD), times 4.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.jax import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(400)]
TOLERANCE = 1e-5
MIXED = {"mixed_float16": 5e-4, "mixed_bfloat16": 3e-3}
#: Outputs (predict) in the half type itself: 2 of its units in the last place, relative.
ULPS = {"mixed_float16": 2 * 2.0**-10, "mixed_bfloat16": 2 * 2.0**-7}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jax_matrix")
    outs = {case: tmp / f"{case}.npz" for case in ("reference", "devices")}
    started = [subprocess.Popen([sys.executable, "-m", "tests.jax.matrix", case, str(out)],
                                cwd=helpers.ROOT, env=helpers.environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for case, out in outs.items()]
    started.append(subprocess.Popen(
        [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2", "--timeout", "360",
         "-m", "tests.jax.matrix", "processes", str(tmp / "processes")],
        cwd=helpers.ROOT, env=helpers.environment(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True))
    workers = [tmp / f"processes.{i}.npz" for i in range(2)]
    reference, devices, *processes = helpers.finish(started, [*outs.values(), *workers],
                                                    timeout=380)
    return {"reference": reference, "devices": devices, "processes": processes}


def names(results):
    return sorted({key.split(":")[0] for key in results})


def tolerance(name):
    return next((tol for mixed, tol in MIXED.items() if mixed in name), TOLERANCE)


def test_every_setting_runs_on_every_lane(runs):
    assert len(names(runs["reference"])) >= 30
    for lane in (runs["reference"], runs["devices"], *runs["processes"]):
        assert not [k for k in lane if k.endswith(":error")], {
            k: str(v) for k, v in lane.items() if k.endswith(":error")}


def test_weights_equal_one_device(runs):
    reference = runs["reference"]
    for name in names(reference):
        keys = [k for k in reference if k.startswith(f"{name}:w")]
        assert keys, name
        for lane, results in (("2 devices", runs["devices"]), ("2 processes", runs["processes"][0]),
                              ("process 1", runs["processes"][1])):
            for key in keys:
                np.testing.assert_allclose(results[key], reference[key], rtol=0,
                                           atol=tolerance(name), err_msg=f"{lane} {key}")


def test_history_evaluate_predict_equal_one_device_and_across_processes(runs):
    reference = runs["reference"]
    first, second = runs["processes"]
    for name in names(reference):
        assert str(first[f"{name}:history"]) == str(second[f"{name}:history"]), name
        np.testing.assert_array_equal(first[f"{name}:predict"], second[f"{name}:predict"])
        expected = json.loads(str(reference[f"{name}:history"]))
        for lane, results in (("2 devices", runs["devices"]), ("2 processes", first)):
            history = json.loads(str(results[f"{name}:history"]))
            assert history.keys() == expected.keys(), (lane, name)
            for key in expected:
                np.testing.assert_allclose(history[key], expected[key], rtol=0,
                                           atol=tolerance(name), err_msg=f"{lane} {name} {key}")
            evaluated = json.loads(str(results[f"{name}:evaluate"]))
            for key, value in json.loads(str(reference[f"{name}:evaluate"])).items():
                np.testing.assert_allclose(evaluated[key], value, rtol=0, atol=tolerance(name),
                                           err_msg=f"{lane} {name} evaluate {key}")
            ulps = next((u for mixed, u in ULPS.items() if mixed in name), 0)
            np.testing.assert_allclose(results[f"{name}:predict"], reference[f"{name}:predict"],
                                       rtol=ulps, atol=tolerance(name), err_msg=f"{lane} {name}")
