"""`kmp.launch` and `kmp-launch` on JAX: each worker joins `jax.distributed` before user
code, the coordinator listens on loopback only, `kmp.topology()` answers, a failing worker
stops every worker with its cause, and only the chief shows progress bars."""

from __future__ import annotations

import ipaddress
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

import keras_mgpu_plugins as kmp
from tests.jax import helpers, launched

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(240)]


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 (the coordinator, tcp6)
    return (mapped or ip).is_loopback


@pytest.fixture
def jax_env(monkeypatch):
    for key, value in helpers.environment().items():
        monkeypatch.setenv(key, value)


def test_workers_join_jax_distributed_and_listen_on_loopback_only(jax_env):
    results = kmp.launch(launched.who_and_what_is_bound, num_workers=2, timeout=180)
    coordinator = int(results[0]["cluster"][0].rpartition(":")[2])
    for index, found in enumerate(results):
        assert found["jax"] == [True, index, 2]
        assert found["topology"] == [index, 2, index == 0]
        assert found["launcher"] == []
        assert found["worker"], found  # gloo's socket (and worker 0's coordinator)
        for sock in found["worker"]:
            assert loopback(sock["address"]), (index, sock)
    assert coordinator in [s["port"] for s in results[0]["worker"]]  # worker 0 serves it


def test_a_failing_worker_stops_every_worker_with_its_cause(jax_env):
    started = time.monotonic()
    with pytest.raises(kmp.launch.WorkerFailedError) as raised:
        kmp.launch(launched.fail_on_worker_one, num_workers=2, timeout=180)
    error = raised.value
    assert error.worker_index == 1 and isinstance(error.remote_exception, ValueError)
    assert "worker one broke on purpose" in str(error)
    assert "The other workers were stopped" in str(error)
    assert time.monotonic() - started < 60  # not the collective's or the coordinator's timeout


def test_kmp_launch_runs_a_script_progress_bars_on_the_chief_only(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import jax, keras, numpy as np
        import keras_mgpu_plugins as kmp
        assert jax.distributed.is_initialized()  # before the script's first line
        def build():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
            return model
        model = kmp.parallelize(build)()
        x = np.ones((16, 3), "float32")
        model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=1)
        print("DONE", kmp.topology().worker_index, jax.process_count())
    """))
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2",
                           "--timeout", "180", "--log-dir", str(logs), str(script)],
                          cwd=helpers.ROOT, env=helpers.environment(), capture_output=True,
                          text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    chief, other = (pathlib.Path(logs, f"worker-{i}.log").read_text() for i in range(2))
    assert "DONE 0 2" in chief and "DONE 1 2" in other
    assert "loss:" in chief and "[worker 0]" in done.stdout + done.stderr
    assert "loss:" not in other  # verbose=1 off on worker 1
