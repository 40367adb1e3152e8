"""`examples/quickstart.py` on the torch lane: it runs itself on 2 processes (`kmp.launch`,
gloo), as docs/torch.md tells users to run it (scikit-learn's digits: the `[examples]`
extra), and under `kmp-launch -n 2` unchanged."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests import quickstart_output
from tests.torch import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(400),
              pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                 reason='needs scikit-learn: pip install -e ".[torch,examples]"')]


@pytest.mark.parametrize("how", ["self-launched", "kmp-launch"])
def test_the_quickstart_trains_on_two_processes(tmp_path, how):
    start = ([] if how == "self-launched" else ["-m", "keras_mgpu_plugins.launch", "-n", "2"])
    done = subprocess.run([sys.executable, *start, "examples/quickstart.py", "--quick",
                           "--out", str(tmp_path)], cwd=helpers.ROOT,
                          env=helpers.environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Training on 2 replicas (Keras backend: torch), global batch 64" in done.stdout
    assert "samples/s (" in done.stdout
    if how == "kmp-launch":  # as a user sees it: at most 3 lines of kmp's own
        assert len(quickstart_output.other_lines(done)) <= quickstart_output.MAX_OTHER_LINES, \
            "\n".join(quickstart_output.other_lines(done))
    accuracy = float(done.stdout.split("validation accuracy ")[1].split(";")[0])
    assert accuracy > 0.5
    assert (tmp_path / "best.keras").is_file()
