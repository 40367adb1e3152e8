"""The one object a callback asks about the job it trains in: `runtime.of(model)`.

Callbacks never hold a backend's strategy and never import a backend: they ask
the model's runtime who this process is (`worker_index`, `num_workers`,
`is_chief`) and run the collectives every worker must run, in the same order:

- `all_gather(vector)`: every worker's vector, stacked in worker order;
- `agree(flag)`: one boolean every worker holds after the call;
- `broadcast(value)`: the chief's value, on every worker;
- `barrier()`: every worker has reached this point;
- `together(action, what)`: runs this worker's part of a step; if it raised on
  any worker, every worker raises, naming that worker's error (no worker is
  left waiting alone); `gather_errors` is its one all-gather of error texts;
- `same_settings(settings, owner)`: raises on every worker if the arguments
  that decide where a callback's collectives run differ between workers.

Each backend provides the rank and `all_gather` (`backends/<name>/runtime.py`);
everything else is built here on those two. In one process (or where the
model's collectives span one worker) every collective is answered locally, the
identity, so one code path serves one device, several devices and several
workers (the idea of Lightning's `strategy.broadcast`).
"""

from __future__ import annotations

from typing import Any

from keras_mgpu_plugins.runtime._base import (
    CAUSE_BYTES,
    ERROR_WIDTH,
    PeerFailedError,
    Rank,
    Runtime,
    SettingsDifferError,
    SingleProcess,
    decode_error,
    encode_error,
)

__all__ = ["CAUSE_BYTES", "ERROR_WIDTH", "PeerFailedError", "Rank", "Runtime",
           "SettingsDifferError", "SingleProcess", "decode_error", "encode_error", "of"]


def of(model: Any = None, *, refuse_apart: bool = True) -> Runtime:
    """The runtime `model` trains under (default: this process's), from the active backend.

    Read at call time, never cached by the caller across `fit` calls: the model's
    distribution can change (a model built again, a strategy created later).

    Args:
        model: The model asked about, or `None` for this process.
        refuse_apart: Raise where `model` would train a separate model on each of several
            processes (`runtime.apart`): what kmp's callbacks ask. `False` for kmp's own
            wrappers of every `fit`, which serve a model trained on one process alone.

    Raises:
        SeparateModelsError: As `runtime.apart.check`.
    """
    from keras_mgpu_plugins import _backend

    here = _backend.active().runtime_of(model)
    if model is not None and refuse_apart:
        from keras_mgpu_plugins.runtime import apart

        apart.check(model, here)
    return here
