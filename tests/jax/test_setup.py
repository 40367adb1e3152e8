"""The JAX lane's setup: who-am-I plans, row shares, strategy refusals, late device counts."""

from __future__ import annotations

import json
import os

import pytest

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins.backends.jax import distribution
from keras_mgpu_plugins.inputs import shuffle
from tests.jax import helpers


def test_each_process_gets_its_share_of_every_global_batch():
    rows = [shuffle.share_rows(20, 8, 2, p).tolist() for p in range(2)]
    assert rows == [[0, 1, 2, 3, 8, 9, 10, 11, 16, 17], [4, 5, 6, 7, 12, 13, 14, 15, 18, 19]]
    assert sorted(rows[0] + rows[1]) == list(range(20))


def test_plan_from_keras_variables():
    env = {"KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:1234,10.0.0.2:2345",
           "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "1"}
    assert distribution.planned_processes(env) == ("10.0.0.1:1234", 2, 1, "keras")


def test_plan_from_tf_config_as_kmp_launch_sets_it():
    config = {"cluster": {"worker": ["localhost:4000", "localhost:4001"]},
              "task": {"type": "worker", "index": 1}}
    plan = distribution.planned_processes({"TF_CONFIG": json.dumps(config)})
    assert plan == ("localhost:4000", 2, 1, "tf_config")


def test_no_plan_for_one_process():
    assert distribution.planned_processes({}) is None
    assert distribution.planned_processes({"KERAS_DISTRIBUTION_NUM_PROCESSES": "1"}) is None


@pytest.mark.parametrize("kwargs, words", [
    ({"strategy": object()}, ["tf.distribute", "JAX backend", "strategy='auto'"]),
    ({"strategy": "nope"}, ["strategy=", "'nope'"]),
    ({"micro_batches": 2}, ["micro_batches=2"]),
    ({"strategy": "parameter_server"}, ["keras-team/keras#20753", "strategy='multi_worker'",
                                        "KERAS_BACKEND=tensorflow"]),
    ({"max_shards": 2}, ["keras-team/keras#20753", "max_shards=2"]),
])
def test_strategies_jax_lacks_are_refused_clearly(kwargs, words):
    with pytest.raises(ValueError) as raised:
        kmp.parallelize(**kwargs)
    assert all(word in str(raised.value) for word in words), str(raised.value)


def test_simulate_devices_after_jax_started_names_both_counts(tmp_path):
    results = helpers.run_one(tmp_path, "late")
    assert results["same"].tolist() == ["cpu:0"]
    message = str(results["error"])
    assert "simulate_devices(3)" in message and "1 CPU device" in message
    assert "first thing" in message


def test_simulate_devices_checks_its_arguments():
    from keras_mgpu_plugins.backends.jax.devices import simulate_devices

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n must be a positive integer"):
            simulate_devices(bad)
    with pytest.raises(ValueError, match="memory_limit_mb"):
        simulate_devices(2, memory_limit_mb=0)


def test_topology_names_the_devices_without_starting_jax(tmp_path):
    """kmp.topology() before simulate_devices (and a decorated factory) leaves JAX unstarted."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import keras_mgpu_plugins as kmp
        import jax._src.xla_bridge as xla_bridge

        @kmp.parallelize
        def build():
            raise AssertionError("not called")

        before = kmp.topology().local_devices
        started = xla_bridge.backends_are_initialized()
        kmp.simulate_devices(3)
        print(before, started, kmp.topology().local_devices)
        import jax
        print(len(jax.local_devices()), kmp.topology().local_devices)
        """)
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run([sys.executable, "-c", code], env={**env, "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = done.stdout.splitlines()[-2:]
    assert first == "('CPU:0',) False ('CPU:0', 'CPU:1', 'CPU:2')"
    assert second == "3 ('CPU:0', 'CPU:1', 'CPU:2')"
