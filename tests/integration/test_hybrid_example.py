"""examples/hybrid.py runs as its docstring says (`kmp-launch -n 2 --no-strategy ... --quick`)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from tests.integration.test_examples import _env, last_json, weights_sha256

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(300)]

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "hybrid.py"


def test_hybrid_example_quick(tmp_path):
    import keras

    logs, tmp_path = tmp_path / "logs", tmp_path / "out"
    tmp_path.mkdir()
    script = pathlib.Path(sys.executable).parent / "kmp-launch"
    command = [str(script)] if script.exists() else [sys.executable, "-m",
                                                     "keras_mgpu_plugins.launch"]
    done = subprocess.run([*command, "-n", "2", "--no-strategy", "--timeout", "240", "--log-dir", str(logs),
                           str(EXAMPLE),
                           "--quick", "--out", str(tmp_path)], env=_env(), capture_output=True,
                          text=True, timeout=280, cwd=EXAMPLE.parents[1])
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    chief = last_json(done.stdout, prefix="[worker 0] ")
    assert "[worker 1]" not in done.stdout  # worker 1's output is in its log file
    log_1 = (logs / "worker-1.log").read_text()
    other = last_json(log_1)
    assert (chief["worker"], other["worker"], chief["workers"]) == (0, 1, 2)
    assert chief["weights_sha256"] == other["weights_sha256"] and chief["loss"] == other["loss"]
    assert chief["verifier_mismatches"] == other["verifier_mismatches"] == 0
    for seen in (chief, other):  # blocks 0-1 on the worker's CPU:0, the rest on its CPU:1
        task = f"/job:worker/replica:0/task:{seen['worker']}/device:CPU:"
        assert {d for p, d in seen["devices"].items() if p.startswith(("block_0", "block_1"))} \
            == {task + "0"}
        assert {d for p, d in seen["devices"].items() if p.startswith(("block_2", "block_3",
                                                                        "logits"))} == {task + "1"}
    report = "Hybrid: 2 workers (data parallel) x 2 devices each"
    assert done.stdout.count(report) == 1 and report not in log_1  # the chief's alone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.keras"]  # the chief's
    loaded = keras.models.load_model(tmp_path / "model.keras")  # plain Keras
    assert weights_sha256(loaded.get_weights()) == chief["weights_sha256"]
