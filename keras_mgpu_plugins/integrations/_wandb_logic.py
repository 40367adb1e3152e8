"""WandbLogger's decisions as pure functions: no Keras, no W&B, unit-tested with numbers."""

from __future__ import annotations

from typing import Any


def worker_run_name(name: str | None, worker_index: int) -> str:
    """The run name of one worker in `"group"` mode."""
    return f"{name or 'run'}-worker{worker_index}"


def format_group_id(value: int) -> str:
    """The group name for a job id drawn as an integer."""
    return f"kmp-{int(value) & (2**63 - 1):016x}"


def checkpoint_aliases(payload: dict[str, Any]) -> list[str]:
    """Artifact aliases for a `"checkpoint_saved"` payload (epoch-N as Keras's `{epoch}`)."""
    aliases = ["latest", f"epoch-{int(payload['epoch']) + 1}"]
    return aliases + ["best"] if payload.get("is_best") else aliases


def batch_sizes(local_counts: list[float], batches_done: int, num_replicas: int) -> dict[str, int]:
    """Global and per-replica batch size from the rows each local replica counted."""
    if batches_done < 1 or not local_counts or local_counts[0] <= 0:
        return {}
    per_replica = int(round(local_counts[0] / batches_done))
    return {"global_batch_size": per_replica * num_replicas, "per_replica_batch_size": per_replica}


class StepCounter:
    """W&B steps: global batches done, monotonic across epochs and resumed fits.

    Args:
        steps_per_epoch: Batches per epoch (`params["steps"]`), or `None` if unknown.
        start: The run's step when `fit` begins (0 for a new run).
    """

    def __init__(self, steps_per_epoch: int | None, start: int = 0) -> None:
        self.steps, self.start = steps_per_epoch, start
        self.first_epoch: int | None = None
        self.epoch = 0
        self.base = self.last = start

    def begin_epoch(self, epoch: int) -> None:
        """Marks the start of `epoch` (the first one seen may be `initial_epoch`)."""
        if self.first_epoch is None:
            self.first_epoch = epoch
            if self.steps:  # a resumed fit starts where its epochs put it
                self.start = max(self.start, epoch * self.steps)
        self.epoch = epoch
        self.base = self._base(epoch)

    def at(self, epoch: int | None = None, batch: int | None = None) -> int:
        """The step after `batch` of `epoch` (default: the current epoch; its end if no batch)."""
        base = self.base if epoch is None or epoch == self.epoch else self._base(epoch)
        if batch is not None:
            step = base + batch + 1
        elif self.steps:
            step = base + self.steps
        else:
            step = max(self.last, base + 1)
        self.last = max(self.last, step)
        return step

    def _base(self, epoch: int) -> int:
        if self.steps and self.first_epoch is not None:
            return self.start + (epoch - self.first_epoch) * self.steps
        return self.last
