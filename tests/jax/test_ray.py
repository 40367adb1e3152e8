"""Ray Train on the JAX lane. Ray 2.60's `JaxTrainer` starts `jax.distributed` on TPUs and GPUs
only (`JaxConfig(use_tpu=True)`, `ScalingConfig(use_gpu=True)`); on CPUs its workers are
unconnected processes, each of which would train a model of its own: `@kmp.parallelize` refuses
that on every worker, naming what Ray supports. (On CPUs, Ray's `TensorflowTrainer` sets the
`TF_CONFIG` kmp's JAX lane reads, where TensorFlow is installed.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.jax import helpers

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(400),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                 reason='needs Ray: pip install -e ".[jax,test,ray]"')]

SCRIPT = """
import ray
from ray.train import ScalingConfig
from ray.train.v2.jax import JaxTrainer

def train(config):
    import keras
    import keras_mgpu_plugins as kmp

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    kmp.parallelize(build)()

ray.init(num_cpus=2, include_dashboard=False,
         runtime_env={"env_vars": {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}})
try:
    JaxTrainer(train, scaling_config=ScalingConfig(num_workers=2, use_gpu=False)).fit()
except Exception as err:
    print("FAILED:", type(err).__name__, err)
else:
    print("TRAINED")
"""


def test_a_cpu_jax_trainer_is_refused_on_every_worker_naming_what_ray_supports():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=helpers.ROOT,
                          env=helpers.environment(), capture_output=True, text=True, timeout=360)
    assert "FAILED:" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]
    output = done.stdout + done.stderr
    assert "but kmp sees 1 worker(s)" in output
    assert "JaxTrainer starts jax.distributed on TPUs and GPUs only" in output
