"""kmp compiles the step functions no more often than plain Keras, on 1 device, 2 and 2 processes.

`tests/jax/compilations_job.py` counts JAX's backend compilations of `train_step`,
`test_step` and `predict_step` per phase (a fit with a partial last batch and validation,
the fit again, evaluate, predict, each twice), each side in fresh processes of the same
devices. One device under kmp was a `DataParallel` of that one device: it compiled the
train step 4 times where plain Keras compiles it twice, and evaluate's step twice where
Keras compiles it once (variables made on the device, not laid out on the one-device mesh
the step's outputs are; the metrics' again after each reset).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import keras_mgpu_plugins as kmp
from tests.jax import compilations_job, helpers

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(400)]


def counted(side: str, devices: int, tmp_path) -> dict:
    out = tmp_path / f"{side}-{devices}.json"
    done = subprocess.run([sys.executable, "-m", "tests.jax.compilations_job", side, str(devices),
                           str(out)], cwd=helpers.ROOT, env=helpers.environment(),
                          capture_output=True, text=True, timeout=helpers.TIMEOUT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def assert_no_more(kmp_counts: dict, plain: dict) -> None:
    assert plain["fit"].get("jit(train_step)"), plain  # the counting counts
    for phase, names in plain.items():
        for name in set(kmp_counts[phase]) | set(names):
            assert kmp_counts[phase].get(name, 0) <= names.get(name, 0), (phase, name, kmp_counts,
                                                                          plain)
    for phase in ("fit again", "evaluate again", "predict again"):
        assert kmp_counts[phase] == {}, kmp_counts  # nothing compiles a second time


@pytest.mark.parametrize("devices", [1, 2])
def test_one_process_compiles_as_plain_keras(devices, tmp_path):
    assert_no_more(counted("kmp", devices, tmp_path), counted("plain", devices, tmp_path))


def test_two_processes_compile_as_plain_keras():
    env = {"KERAS_BACKEND": "jax", **helpers.simulated_devices(1)}  # one device per process
    sides = {side: kmp.launch(compilations_job.on_each_process, num_workers=2, args=(side,),
                              timeout=300, create_strategy=False, env=env)
             for side in ("plain", "kmp")}
    for rank in (0, 1):
        plain = next(r["counts"] for r in sides["plain"] if r["rank"] == rank)
        mine = next(r["counts"] for r in sides["kmp"] if r["rank"] == rank)
        assert "predict" not in plain  # plain Keras cannot read predictions over processes
        assert_no_more(mine, plain)
        assert mine["predict"].get("jit(predict_step)") == 2  # full batches, the partial one
