"""Collectives over torch's default process group, on the tensors' device it needs.

gloo runs on CPU tensors, NCCL on the process's GPU (`torch.cuda.current_device()`);
every function moves what it sends there and back. Each is one collective call that
every process must make, in the same order.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def initialized() -> bool:
    """Whether torch's default process group exists (never imports `torch.distributed`
    for the first time, and never starts one)."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def world() -> tuple[int, int]:
    """`(rank, world size)` of the default process group (`(0, 1)` without one)."""
    if not initialized():
        return 0, 1
    import torch.distributed as dist

    return int(dist.get_rank()), int(dist.get_world_size())


def device() -> Any:
    """Where the group's collectives run: this process's GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_(tensor: Any) -> Any:
    """Sums `tensor` over every process, in place (on the group's device); returns it."""
    import torch.distributed as dist

    target = device()
    moved = tensor if tensor.device == target else tensor.to(target)
    dist.all_reduce(moved)
    if moved is not tensor:
        tensor.copy_(moved.to(tensor.device))
    return tensor


def gather_numpy(wire: np.ndarray) -> np.ndarray:
    """Every process's `wire` (one shape and dtype everywhere), stacked in rank order."""
    import torch
    import torch.distributed as dist

    mine = torch.from_numpy(np.ascontiguousarray(wire)).to(device())
    out = [torch.empty_like(mine) for _ in range(world()[1])]
    dist.all_gather(out, mine)
    return torch.stack(out).cpu().numpy()


def gather_rows(tensors: list, rows: int) -> list:
    """Every process's rows of each tensor (first axis `rows` here, possibly 0, other axes the
    same everywhere), concatenated in rank order, on every process: two collectives (the
    counts, then the rows padded to the largest count)."""
    import torch
    import torch.distributed as dist

    counts = [int(c) for c in gather_numpy(np.array([rows], np.int64))[:, 0]]
    top, out = max(counts), []
    for tensor in tensors:
        padded = torch.zeros((top, *tensor.shape[1:]), dtype=tensor.dtype, device=device())
        padded[:rows] = tensor.to(padded.device)
        every = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(every, padded)
        pieces = [every[i][:n] for i, n in enumerate(counts)]
        out.append(torch.cat(pieces).to(tensor.device))
    return out


def broadcast_(tensors: list, root: int = 0) -> None:
    """Every process's `tensors` := `root`'s, in place, exactly: one collective per dtype."""
    import torch
    import torch.distributed as dist

    groups: dict[Any, list] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    for dtype, group in groups.items():
        flat = torch.cat([t.detach().reshape(-1).to(device()) for t in group])
        dist.broadcast(flat, src=root)
        offset = 0
        for t in group:
            n = t.numel()
            with torch.no_grad():
                t.copy_(flat[offset:offset + n].reshape(t.shape).to(t.device, dtype))
            offset += n
