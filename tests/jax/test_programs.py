"""Keras-on-JAX programs written by others run unchanged on 2 devices, on 2 processes and, for
the large-model ones, with `strategy="model_parallel"`, as on one device.

Six programs (`tests/programs/jax_*.py`: keras.io's custom JAX `train_step` guide, its image
classifier with augmentation layers, its miniature GPT with a callback that predicts, its
distribution guide with its own LayoutMap, and two keras-hub tasks built from small
configs: a `BertTextClassifier` whose class overrides `fit`, a `GemmaCausalLM` with the
backbone's own `get_layout_map`), each with a row count or a batch that does not divide
over 2 devices, adapted with the decorator alone (`tests/jax/programs.py`). Weights after
`fit`, every History key, `evaluate` and `predict` must agree with one device within 1e-5,
or within ten times the program's own float noise where that is larger (the same program
on one device with the rows of each batch reversed). The figures:

    PYTHONPATH=. KERAS_BACKEND=jax python -m tests.jax.programs --table
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

import keras_mgpu_plugins as kmp
from tests.jax import helpers, programs
from tests.programs import JAX_PROGRAMS

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(1800)]
TOLERANCE = 1e-5
_RUNS: dict = {}


def all_runs(folder: str) -> dict:
    """One device (and noise), 2 devices (and model_parallel) in fresh processes, and 2
    processes through `kmp.launch`, started together."""
    if _RUNS:
        return _RUNS
    if "keras_hub" not in sys.modules:
        pytest.importorskip("keras_hub")
    started = {}
    for mode, devices in (("one", 1), ("devices", 2)):
        out = f"{folder}/{mode}.pkl"
        started[mode] = (subprocess.Popen(
            [sys.executable, "-m", "tests.jax.programs", mode, out], cwd=helpers.ROOT,
            env=helpers.environment(**helpers.simulated_devices(devices)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out)
    with pytest.MonkeyPatch.context() as patch:  # 2 processes of one CPU device each, as
        # `kmp-launch -n 2` gives (the augmentation layers make Keras run eagerly, which kmp
        # refuses on processes of several CPU devices: gloo hangs there)
        for key, value in helpers.environment().items():
            patch.setenv(key, value)
        processes = kmp.launch(programs.on_processes, num_workers=2, timeout=1700,
                               env=helpers.simulated_devices(1))
    for mode, (process, out) in started.items():
        log = process.communicate(timeout=1700)[0]
        assert process.returncode == 0, log[-3000:]
        with open(out, "rb") as f:
            _RUNS[mode] = pickle.load(f)
    _RUNS["processes"] = processes
    return _RUNS


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return all_runs(str(tmp_path_factory.mktemp("jax_programs")))


def candidates(runs: dict, name: str) -> list[tuple[str, dict]]:
    found = [("2 devices", runs["devices"][f"{name}/devices"])]
    found += [(f"process {i}", r[f"{name}/processes"]) for i, r in enumerate(runs["processes"])]
    if f"{name}/model_parallel" in runs["devices"]:
        found.append(("model_parallel", runs["devices"][f"{name}/model_parallel"]))
    return found


@pytest.mark.parametrize("name", JAX_PROGRAMS)
def test_program_runs_as_on_one_device(runs, name):
    one, noise = runs["one"][f"{name}/one"], runs["one"][f"{name}/noise"]
    assert "error" not in one, one.get("error")
    level = programs.largest_difference(noise, one)["weights"] if "error" not in noise else 0
    tolerance = max(TOLERANCE, 10 * level)
    for mode, found in candidates(runs, name):
        assert "error" not in found, f"{mode}: {found['error']}"
        assert found["history"].keys() == one["history"].keys(), mode
        difference = programs.largest_difference(found, one)
        assert all(v <= tolerance for v in difference.values()), (mode, difference, tolerance)
        assert found["generated"] == one["generated"], mode  # the GPT's sampled tokens


@pytest.mark.parametrize("name", JAX_PROGRAMS)
def test_both_processes_log_and_hold_the_same(runs, name):
    first, second = (r[f"{name}/processes"] for r in runs["processes"])
    assert first["history"] == second["history"] and first["evaluate"] == second["evaluate"]
    for a, b in zip(first["weights"] + first["predict"], second["weights"] + second["predict"],
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_every_large_model_program_ran_model_parallel(runs):
    large = [n for n in JAX_PROGRAMS if getattr(programs.program(n), "LARGE", False)]
    assert len(large) >= 3
    assert all(f"{n}/model_parallel" in runs["devices"] for n in large)
