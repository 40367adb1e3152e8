"""`examples/quickstart.py` with kmp-verify's one-device runs on the GPU and its parallel run
on CPU devices: the script the GPU run's `verify` part verifies (part_verify.py says why).

In a kmp-verify run (`KMP_VERIFY` set), before JAX starts: the one-device runs (reference
and noise) train on the platform `KMP_GPU_VERIFY_PLATFORM` names (`cuda` on the GPU
machine, `cpu` in the dry run), the parallel run on CPU devices (`-n` of them, split by the
quickstart's `kmp.simulate_devices`). Then the quickstart, unchanged, and one line naming
the devices the run trained on (the part reads it from the runs' logs).
"""

from __future__ import annotations

import os
import sys

from keras_mgpu_plugins.verify import _config

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))

import quickstart  # noqa: E402 - examples/, put on sys.path above

if __name__ == "__main__":
    run = _config.current()
    if run is not None:
        one_device = run.devices == 1 and run.workers == 1
        os.environ["JAX_PLATFORMS"] = (os.environ.get("KMP_GPU_VERIFY_PLATFORM", "cuda")
                                       if one_device else "cpu")
    quickstart.main(sys.argv[1:])
    import jax

    print(f"kmp-gpu-verify: run {run.run if run else None} trained on "
          f"{[str(d) for d in jax.devices()]}", flush=True)
