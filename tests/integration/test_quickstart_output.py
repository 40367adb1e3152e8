"""`kmp-launch -n 2 examples/quickstart.py` on the TensorFlow lane prints at most 3 lines that
are neither the script's nor Keras's progress bar; TensorFlow's C++ logs and its coordination
service's lines (about 20 on worker 0 before) are in the workers' log files."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests import quickstart_output

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(400),
              pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                 reason='needs scikit-learn: pip install -e ".[tensorflow,examples]"')]


def test_a_two_worker_quickstart_prints_at_most_three_lines_of_its_own(tmp_path):
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the TensorFlow lane's (tests/jax, tests/torch: the others')")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "KMP_"))}
    others = quickstart_output.check_quiet(tmp_path, env, in_log="coordination_service")
    assert any(line.startswith("kmp-launch: showing worker 0's output") for line in others)
