"""Settings that several torch processes cannot train as one device does: refused at the call,
naming the setting and what to use instead."""

from __future__ import annotations

from typing import Any

#: Loss reductions whose per-process value, weighted by rows, is the global batch's.
_AVERAGED = ("sum_over_batch_size", "mean", None)


def check(model: Any, method: str) -> None:
    """Raises `ValueError` for a setting of `model` kmp cannot run alike on several processes."""
    if getattr(model, "jit_compile", False):
        raise ValueError(
            f"{method}: jit_compile=True compiles each step with torch.compile, which kmp's "
            "steps on several torch processes (their collectives between the backward pass "
            "and the optimizer) do not run under: measured (torch 2.13, 2 CPU processes), the "
            "first fit never finished, one process left waiting. "
            "Compile with jit_compile=False (Keras's default on torch; 'auto' is False there).")
    if method == "fit":
        _check_losses(model)


def _check_losses(model: Any) -> None:
    import keras

    losses = [loss for loss in keras.tree.flatten(getattr(model, "loss", None))
              if isinstance(loss, keras.losses.Loss)]
    odd = [loss for loss in losses if getattr(loss, "reduction", None) not in _AVERAGED]
    if odd:
        loss = odd[0]
        raise ValueError(
            f"{type(loss).__name__}(reduction={loss.reduction!r}): kmp averages the processes' "
            "gradients weighted by their rows, which gives the global batch's gradient for a "
            "loss averaged over the batch (reduction='sum_over_batch_size', Keras's default) "
            "only. Compile with that reduction (scale the learning rate for a sum), or train "
            "on one process.")
