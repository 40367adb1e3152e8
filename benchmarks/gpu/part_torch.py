"""The torch lane's GPU path (`KERAS_BACKEND=torch`): skipped with "torch lane not present"
while `keras_mgpu_plugins.backends.torch` does not exist, so that it runs once the lane lands.

When present: the torch lane's tests marked `gpu` (if any: `tests/torch`, `-m gpu`, with
`KMP_TESTS_REAL_DEVICES=1`), then the throughput part's comparison on torch for the
ResNet-style CNN (kmp with every callback against plain Keras on torch, bf16), without
the FLOPs count (XLA's cost analysis is JAX's), and `DeviceMetricsLogger`'s keys, which
come from `torch.cuda`'s allocator and NVML there.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import common
import part_tests
from part_throughput import SIZES as THROUGHPUT

LANE = "keras_mgpu_plugins.backends.torch"
SIZES = {
    "gpu": {**THROUGHPUT["gpu"], "rounds": 2, "fit_seconds": 3.0},
    "cpu": {**THROUGHPUT["cpu"]},
}


def present() -> bool:
    try:
        return importlib.util.find_spec(LANE) is not None
    except ImportError:  # keras_mgpu_plugins.backends itself missing
        return False


def run(rec: common.Recorder, size: dict) -> None:
    if not present():
        rec.skip(f"torch lane not present ({LANE} is missing)")
        return
    if importlib.util.find_spec("torch") is None:
        rec.skip("torch is not installed")
        return
    import keras
    import torch

    rec.put(keras_backend=keras.backend.backend(), torch=torch.__version__,
            cuda=torch.cuda.is_available(),
            device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    with rec.step("tests"):
        junit = os.path.join(os.path.dirname(rec.path or "."), ".torch-junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
               f"--junitxml={junit}", "tests/torch"]
        code = subprocess.run(cmd, cwd=part_tests.ROOT,
                              env={**os.environ, "KMP_TESTS_REAL_DEVICES": "1"}).returncode
        tests = part_tests.outcomes(junit) if os.path.exists(junit) else []
        rec.put(tests_exit_code=code, tests=tests)  # 5: no test marked gpu there yet
        if code not in (0, 5):
            raise RuntimeError(f"pytest -m gpu tests/torch: exit code {code}")
    with rec.step("resnet"):
        from part_throughput import compare

        rec.put(resnet=compare("resnet", size, flops=False))
