"""kmp-verify on a script that writes and reads files in its working folder, on every lane.

The runs are side by side; a script writes where it is started (`ModelCheckpoint("best.keras")`)
and loads what it wrote. Each run works in a folder of its own (`<log dir>/<run>/files`) whose
entries are links to those of the folder kmp-verify was started in: the script reads its data
there as before, no run sees a file another run wrote, and nothing is written beside the
user's script. The script fails if another run's marker is in its folder while it trains.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(600)]

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = '''
import os
import time

import keras
import numpy as np

import keras_mgpu_plugins as kmp

marker = f"running-{os.environ.get('KMP_WORKER_INDEX', '0')}"  # one per process of a run
assert not os.path.exists(marker), "another run wrote its marker in this run's folder"
open(marker, "w").close()
data = np.load("data.npy")  # the user's file, in the folder the command was started in
x, y = data[:, :4], data[:, 4:]


@kmp.parallelize
def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


model = build()
model.fit(x, y, batch_size=16, epochs=2, verbose=0,
          callbacks=[kmp.callbacks.ModelCheckpoint("best.keras")])
time.sleep(2)  # the runs overlap: a shared folder would show the other run's marker
best = keras.models.load_model("best.keras")
model.evaluate(x, y, verbose=0)
os.remove(marker)
'''


def test_each_run_writes_and_reads_its_own_files_beside_the_users_data(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(64, 5)).astype("float32")
    np.save(tmp_path / "data.npy", data)
    (tmp_path / "train.py").write_text(SCRIPT)
    logs = tmp_path / "verify-logs"  # inside the user's folder: not linked into the runs'
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-m", "keras_mgpu_plugins.verify", "-n", "2", "--steps", "6",
         "--log-dir", str(logs), "--json", str(tmp_path / "verify.json"), "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert json.loads((tmp_path / "verify.json").read_text())["verdict"] == "equal"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "data.npy", "train.py", "verify-logs", "verify.json"]  # nothing written beside them
    for run in ("reference", "noise", "parallel"):
        files = logs / run / "files"
        assert (files / "best.keras").is_file() and not (files / "best.keras").is_symlink(), run
        assert (files / "data.npy").is_symlink(), run
        assert not (files / "verify-logs").exists(), run
        assert not list(files.glob("running-*")), run  # each process removed its own
