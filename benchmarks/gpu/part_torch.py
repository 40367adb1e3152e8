"""The torch lane on the device (`KERAS_BACKEND=torch`, one process: torch trains one device
per process, and the machine has one GPU).

- `tests`: the torch lane's tests marked `gpu` (`pytest -m gpu tests/torch`,
  `KMP_TESTS_REAL_DEVICES=1`: `tests/torch/test_gpu.py`); where none is collected the
  step is skipped, saying so;
- `resnet`, `transformer`: the throughput part's comparison (`part_throughput.compare`) on
  torch, the same models in `mixed_bfloat16`: `@kmp.parallelize` with every kmp callback
  against plain Keras on torch with none (goal `ratio_steps` >= 0.99), and the kmp model
  without callbacks (`ratio_bare`); no FLOPs count (XLA's cost analysis is JAX's);
- `keras_ddp`: where the installed Keras wraps the model in `DistributedDataParallel` in
  `fit` (keras-team/keras#23316, keras-nightly; `compat._torch.keras_has_upstream_ddp`),
  the ResNet comparison again inside a process group of one (NCCL on the GPU, gloo on the
  CPU): its plain side is then Keras's own DDP fit. Skipped, with the installed version,
  where Keras has none (3.15.1, the version the run carries, has none).

The part is skipped, with the reason, where this interpreter has no torch (the JAX lane's
environment in CI's dry run: `run.py --python torch=PATH` gives the part the torch lane's).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys

import common
import part_tests
from part_throughput import SIZES as THROUGHPUT

LANE = "keras_mgpu_plugins.backends.torch"
SIZES = {
    "gpu": {**THROUGHPUT["gpu"], "rounds": 2, "fit_seconds": 1.5, "min_steps": 8},
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
        rec.skip(f"torch is not installed in this interpreter ({sys.executable}); "
                 "run.py --python torch=PATH names one that has it")
        return
    import keras
    import torch

    rec.put(keras_backend=keras.backend.backend(), keras=keras.__version__,
            torch=torch.__version__, cuda=torch.cuda.is_available(),
            device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    with rec.step("tests") as step:
        tests(rec, step)
    from part_throughput import compare

    for kind in ("resnet", "transformer"):
        with rec.step(kind):
            rec.put(**{kind: compare(kind, size, flops=False)})
    with rec.step("keras_ddp") as step:
        from keras_mgpu_plugins.compat._torch import keras_has_upstream_ddp

        if not keras_has_upstream_ddp():
            step.update(status="skipped", message=f"the installed Keras {keras.__version__} "
                        "has no DDP fit (keras-team/keras#23316: keras-nightly)")
        else:
            rec.put(keras_ddp=in_group_of_one(lambda: compare("resnet", size, flops=False)))


def tests(rec: common.Recorder, step: dict) -> None:
    junit = os.path.join(os.path.dirname(rec.path or "."), ".torch-junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rA",
           f"--junitxml={junit}", "tests/torch"]
    code = subprocess.run(cmd, cwd=part_tests.ROOT,
                          env={**os.environ, "KMP_TESTS_REAL_DEVICES": "1"}).returncode
    found = part_tests.outcomes(junit) if os.path.exists(junit) else []
    if os.path.exists(junit):
        os.remove(junit)
    rec.put(tests_exit_code=code, tests=found)
    if code == 5:  # pytest: no test collected
        step.update(status="skipped", message="no test of tests/torch is marked gpu")
    elif code != 0:
        step.update(status="failed", message=f"pytest -m gpu tests/torch: exit code {code}; "
                    + "; ".join(f"{t['name']}: {t['message'][:300]}" for t in found
                                if t["outcome"] in ("failed", "error")))


def in_group_of_one(measure) -> dict:
    """`measure()` inside a torch process group of this one process (NCCL on a GPU, else
    gloo), where Keras's `fit` wraps the model in DDP; the group is destroyed after."""
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        found = measure()
    finally:
        dist.destroy_process_group()
    found.update(process_group=backend, note="plain_* is Keras's own DDP fit here (a process "
                 "group of one exists): kmp + callbacks / Keras's DDP fit")
    return found
