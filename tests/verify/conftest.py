"""kmp-verify's tests: `test_logic.py` on every lane; each lane's own file only where Keras
runs on that backend (`test_tensorflow.py`, `test_jax.py`, `test_torch.py`), in its CI job."""

from __future__ import annotations

import keras

_LANES = {"tensorflow": "test_tensorflow.py", "jax": "test_jax.py", "torch": "test_torch.py"}
collect_ignore = [f for lane, f in _LANES.items() if lane != keras.backend.backend()]
