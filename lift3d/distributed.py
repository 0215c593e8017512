"""Collectives over the ranks of a multi-process run, as plain functions that are no-ops in one process."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


def world_size() -> int:
    """The number of processes in the default group (1 without torch.distributed)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_sum_(tensors: Iterable[Tensor]) -> None:
    """Sum ``tensors`` in place over all ranks in one collective (nothing to do in a single process)."""
    import torch.distributed as dist

    tensors = list(tensors)
    if world_size() <= 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1).to(torch.float64 if t.dtype == torch.float64 else torch.float32) for t in tensors])
    dist.all_reduce(flat)
    offset = 0
    for tensor in tensors:
        tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()
