"""`examples/quickstart.py` on the JAX lane, as docs/jax.md tells users to run it.

It needs the `[examples]` extra (scikit-learn's digits: `pip install
"keras_mgpu_plugins[jax,examples]"`), and prints no warning: its `DeviceMetricsLogger`
is given `batch_size=`, without which it warns on JAX that rows are not counted.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests import quickstart_output
from tests.jax import helpers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                 reason='needs scikit-learn: pip install -e ".[jax,examples]"')]


def test_the_quickstart_trains_on_two_devices_without_a_warning(tmp_path):
    """No warning at all on a released Keras. On a pre-release (the canary's keras-nightly)
    kmp says once per private use and per patch that it runs outside the checked range (the
    policy of `KMP_ALLOW_UNCHECKED_VERSIONS`): those, and only those, are expected there."""
    import keras
    from packaging.version import Version

    prerelease = Version(keras.__version__).is_prerelease
    done = subprocess.run(
        [sys.executable, *([] if prerelease else ["-W", "error::UserWarning"]),
         "examples/quickstart.py", "--quick", "--out", str(tmp_path)],
        cwd=helpers.ROOT, env=helpers.environment(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Training on 2 replicas (Keras backend: jax), global batch 64" in done.stdout
    unchecked = ("so it is used", "outside the versions these patches were checked for",
                 "keras_mgpu_plugins was not checked with Keras")
    warned = [line for line in done.stderr.splitlines() if "Warning" in line
              and not (prerelease and any(text in line for text in unchecked))]
    assert warned == [], done.stderr[-3000:]
    assert "samples/s (" in done.stdout and "nan samples/s" not in done.stdout  # rows counted
    assert (tmp_path / "best.keras").is_file()


def test_a_two_process_quickstart_prints_at_most_three_lines_of_its_own(tmp_path):
    """`kmp-launch -n 2`: one device per process (replicated variables spanning 2 processes);
    Gloo's lines go to the log files only."""
    others = quickstart_output.check_quiet(tmp_path, helpers.environment(), in_log="[Gloo]")
    assert any(line.startswith("kmp-launch: showing worker 0's output") for line in others)
