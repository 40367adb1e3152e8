"""The JAX lane on a real GPU: tests marked `gpu`, run by `benchmarks/gpu/run.py`'s `tests` part.

Skipped as a whole unless Keras runs on JAX. Outside the GPU run the root conftest skips
every `gpu` test; inside it (`KMP_TESTS_REAL_DEVICES=1`: no simulated devices) the
`device` fixture skips where JAX has no GPU, except in the run's CPU dry run
(`KMP_GPU_DRY_RUN=1`), where the same tests run on the CPU and assert what a CPU gives
(no memory statistics, no NVML). `record(**values)` appends what a test measured to
`$KMP_GPU_RECORD` (JSON lines), which the run puts in its JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys

BENCHMARKS_GPU = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
DRY_RUN = os.environ.get("KMP_GPU_DRY_RUN") == "1"


def _on_jax() -> bool:
    if importlib.util.find_spec("jax") is None:
        return False
    import keras

    return keras.backend.backend() == "jax"


collect_ignore_glob = [] if _on_jax() else ["test_*.py"]


if _on_jax():
    import pytest

    if str(BENCHMARKS_GPU) not in sys.path:  # smi.py (nvidia-smi), models.py (Batches)
        sys.path.append(str(BENCHMARKS_GPU))

    @pytest.fixture
    def device():
        """JAX's first device: a GPU, or the CPU in the run's dry run (else skipped)."""
        import jax

        first = jax.devices()[0]
        if first.platform != "gpu" and not DRY_RUN:
            pytest.skip(f"needs a GPU; JAX's first device is {first}")
        return first

    @pytest.fixture
    def record(request):
        """`record(**values)`: what this test measured, for the GPU run's JSON."""
        path = os.environ.get("KMP_GPU_RECORD")

        def write(**values) -> None:
            if path:
                with open(path, "a") as f:
                    f.write(json.dumps({"test": request.node.name, **values}, default=str) + "\n")

        return write
