"""examples/legacy_multi_gpu_model.py: the legacy recipe, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "legacy_multi_gpu_model.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_legacy_recipe_saves_the_trained_template(tmp_path):
    pytest.importorskip("sklearn")
    import keras

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["epochs_run"] == 3
    assert result["template_equals_parallel"] and result["template_equals_best_checkpoint"]

    saved = keras.saving.load_model(tmp_path / "my_model.keras")
    best = keras.saving.load_model(tmp_path / "best.keras")
    assert {p.name for p in tmp_path.iterdir()} >= {"my_model.keras", "best.keras"}
    assert isinstance(saved, keras.Sequential) and [layer.units for layer in saved.layers] == [
        128,
        64,
        10,
    ]
    for a, b in zip(saved.get_weights(), best.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)

    from sklearn.datasets import load_digits

    digits = load_digits()
    x, labels = (digits.data / 16.0).astype("float32")[1536:], digits.target[1536:]
    accuracy = float(np.mean(saved.predict(x, verbose=0).argmax(axis=1) == labels))
    assert accuracy == pytest.approx(result["test_accuracy"], abs=1e-3)
    assert accuracy > 0.3  # trained: chance is 0.1
