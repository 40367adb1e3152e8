"""torch's inter-op threads: the launcher's share of the cores (no variable sizes them).

torch sizes its intra-op pool from `OMP_NUM_THREADS` (set by `kmp-launch`, as by torchrun);
its inter-op pool only through `torch.set_num_interop_threads`, which can be called once,
before the pool starts. So the share (`launch._tuning.SHARE_VAR`) is applied at the first
`fit`, `evaluate` or `predict` of a job, after the script's own lines: a script that set the
pool itself (or already ran inter-op work) keeps its setting.
"""

from __future__ import annotations

import os

from keras_mgpu_plugins.launch._tuning import SHARE_VAR

_state = {"done": False}


def share_interop() -> int | None:
    """Sets torch's inter-op threads to `SHARE_VAR`, once per process.

    Returns:
        The threads set, or `None` (no share given, already done, or the pool is the
        script's: set by it, or started).
    """
    if _state["done"]:
        return None
    _state["done"] = True
    text = os.environ.get(SHARE_VAR, "").strip()
    if not text.isdigit() or int(text) < 1:
        return None
    import torch

    try:
        torch.set_num_interop_threads(int(text))
    except RuntimeError:  # "cannot set number of interop threads after parallel work has
        return None       # started or set_num_interop_threads called": the script's, kept
    return int(text)
