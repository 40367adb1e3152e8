"""The private Keras trainer API `BackupAndRestore` resumes through: its train function.

Each helper names the `PrivateUse` it relies on (`compat._private_uses`) and calls
`require(name)` first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins.compat._private_uses import require


def skip_train_steps(model: Any, steps: int) -> Callable[[], None]:
    """Makes the running `fit`'s next `steps` train steps draw their batches and skip them.

    A resumed `fit` thus starts mid-epoch: the batches the backup had trained are drawn
    from the input in the same order (so the next ones are the uninterrupted run's) but
    not trained. Replaces `model.train_function` (made by `fit` before `on_train_begin`)
    on the instance, and puts Keras's back after the last skipped step (or at `undo`).
    A skipped step's logs are empty (`{}`).

    Returns:
        The undo (idempotent).

    Raises:
        RuntimeError: If this Keras calls its train function otherwise (`require`).
    """
    import keras

    require("train_function")
    original = model.train_function
    left = [int(steps)]
    jax = keras.backend.backend() == "jax"

    def undo() -> None:
        left[0] = 0
        if vars(model).get("train_function") is skipping:
            model.train_function = original

    def draw(iterator: Any) -> None:
        for _ in range(int(getattr(model, "steps_per_execution", 1) or 1)):
            next(iterator)

    def skipping(*args: Any) -> Any:
        if left[0] <= 0:
            undo()
            return original(*args)
        left[0] -= 1
        if left[0] == 0:
            undo()
        if jax:
            state, iterator = args
            draw(iterator)
            return {}, state
        draw(args[0])
        return {}

    if steps > 0:
        model.train_function = skipping
    return undo
