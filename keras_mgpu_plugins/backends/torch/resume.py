"""What a resumed `fit` needs of torch beyond Keras's own state (`callbacks._training_state`).

- torch's global random generators: Keras on torch draws from them where it has no seed
  generator of its own (an unseeded `Dropout`'s masks: `torch.nn.functional.dropout`; the
  shuffle of arrays in one process: `DataLoader`'s `RandomSampler`; each `DataLoader`
  iterator's base seed). Their state is the CPU generator's, then the current GPU's where
  one is in use.
- the pieces kmp fed for batches a resumed epoch drew and did not train (`feeding`): their
  `StepInfo`s are dropped, so the first trained step takes its own.
"""

from __future__ import annotations

from typing import Any


def random_state() -> list[int]:
    """This process's state of torch's global generators (CPU, then the current GPU's), as
    JSON values."""
    import torch

    state = torch.get_rng_state().tolist()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state += torch.cuda.get_rng_state().tolist()
    return state


def set_random_state(state: list[int]) -> None:
    """Gives torch's global generators the state `random_state` returned (a GPU's part is
    left out where this process has no GPU in use)."""
    import torch

    size = torch.get_rng_state().numel()
    torch.set_rng_state(torch.tensor(state[:size], dtype=torch.uint8))
    rest = state[size:]
    if rest and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(torch.tensor(rest, dtype=torch.uint8))


def drop_fed(model: Any, count: int) -> None:
    """Forgets the `count` oldest pieces kmp fed `model` (drawn, never trained)."""
    from keras_mgpu_plugins.backends.torch import models

    found = models.arranged(model)
    for _ in range(min(count, len(found.queue)) if found is not None else 0):
        found.queue.popleft()
