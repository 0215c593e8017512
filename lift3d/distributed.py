"""Collectives over the ranks of a multi-process run, as plain functions that are no-ops in one process.

Beside the sums of replicated training (``all_reduce_sum_``): the exchanges of sharded Gaussians, whose ranks hold
different numbers of rows. ``exchange`` is an all-to-all of rows (differentiable: its backward sends the gradients
back the way the rows came), ``gather_to_zero`` brings every rank's rows to rank 0 one rank at a time (a checkpoint of
the whole model without a whole copy on any device), ``all_gather_rows`` gives every rank all of them. Each works on
gloo (the CPU) and NCCL (tensors on the rank's GPU)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor


def world_size() -> int:
    """The number of processes in the default group (1 without torch.distributed)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the default group (0 without torch.distributed)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _collective_device(like: Tensor) -> torch.device:
    """Where a collective's tensors must live: the rank's GPU under NCCL, the CPU under gloo."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return like.device if like.is_cuda else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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


def all_gather_ints(values: Sequence[int], like: Tensor | None = None) -> list[list[int]]:
    """Every rank's ``values`` (the same length on every rank), by rank."""
    import torch.distributed as dist

    if world_size() <= 1:
        return [list(values)]
    local = torch.tensor(list(values), dtype=torch.int64, device=_collective_device(like if like is not None else torch.zeros(0)))
    gathered = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(gathered, local)
    return [row.tolist() for row in gathered]


def exclusive_offset(count: int) -> tuple[int, int]:
    """(the sum of ``count`` over the ranks before this one, the sum over all): where this rank's rows start in the
    rows of all ranks concatenated in rank order."""
    counts = [row[0] for row in all_gather_ints([count])]
    return sum(counts[: rank()]), sum(counts)


def max_over_ranks(value: float) -> float:
    """The largest ``value`` over the ranks (a decision every rank must take alike)."""
    import torch.distributed as dist

    if world_size() <= 1:
        return value
    local = torch.tensor([float(value)], dtype=torch.float64, device=_collective_device(torch.zeros(0)))
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    return float(local)


class _Exchange(torch.autograd.Function):
    """All-to-all of rows: ``send_counts[d]`` rows of ``rows`` go to rank d (in order), ``recv_counts[s]`` arrive from
    rank s. The backward sends the gradients of the received rows back to their senders."""

    @staticmethod
    def forward(ctx, rows: Tensor, send_counts: list[int], recv_counts: list[int]) -> Tensor:  # noqa: ANN001
        import torch.distributed as dist

        ctx.counts = (send_counts, recv_counts)
        device = _collective_device(rows)
        received = rows.new_empty((sum(recv_counts), *rows.shape[1:]), device=device)
        dist.all_to_all_single(received, rows.contiguous().to(device), recv_counts, send_counts)
        return received.to(rows.device)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # noqa: ANN001
        send_counts, recv_counts = ctx.counts
        return _Exchange.apply(grad.contiguous(), recv_counts, send_counts), None, None


def exchange(rows: Tensor, send_counts: Sequence[int], recv_counts: Sequence[int] | None = None) -> Tensor:
    """Rows [R, ...] split by ``send_counts`` (one count per rank, in rank order) sent to their ranks; returns the
    rows every rank sent this one, in rank order. ``recv_counts`` (what each rank sends here) is exchanged first when
    not given. Differentiable in ``rows``."""
    send_counts = [int(c) for c in send_counts]
    if recv_counts is None:
        recv_counts = [row[rank()] for row in all_gather_ints(send_counts, rows)]
    if world_size() <= 1:
        return rows
    return _Exchange.apply(rows, send_counts, [int(c) for c in recv_counts])


def all_gather_rows(rows: Tensor) -> Tensor:
    """Every rank's rows [R_r, ...] concatenated in rank order, on every rank (differentiable)."""
    n = world_size()
    return exchange(rows.repeat(n, *([1] * (rows.ndim - 1))) if n > 1 else rows, [len(rows)] * n)


def gather_to_zero(rows: Tensor) -> Tensor | None:
    """Rank 0: every rank's rows concatenated in rank order, on the CPU, brought over one rank at a time (no device
    holds more than its own rows and one other rank's); other ranks send theirs and get None."""
    import torch.distributed as dist

    if world_size() <= 1:
        return rows.detach().cpu()
    device = _collective_device(rows)
    counts = [row[0] for row in all_gather_ints([len(rows)], rows)]
    if rank() != 0:
        if counts[rank()]:
            dist.send(rows.detach().contiguous().to(device), dst=0)
        return None
    parts = [rows.detach().cpu()]
    for source in range(1, world_size()):
        if counts[source]:
            buffer = rows.new_empty((counts[source], *rows.shape[1:]), device=device)
            dist.recv(buffer, src=source)
            parts.append(buffer.cpu())
    return torch.cat(parts)


def kth_largest(values: Tensor, k: int) -> float:
    """The ``k``-th largest of the ``values`` of every rank together (k <= 0: +inf, more than there are: -inf), the
    same on every rank."""
    if k <= 0:
        return float("inf")
    gathered = all_gather_rows(values.detach().float().reshape(-1)) if world_size() > 1 else values.detach().float()
    if k > len(gathered):
        return float("-inf")
    return float(torch.topk(gathered, k).values[-1])


def finite_on_every_rank(total: Tensor) -> bool:
    """Whether the loss is finite, agreed by all DDP ranks (one rank skipping or stopping alone would leave the
    others waiting in the next collective); the steps checked are the same on every rank."""
    import torch.distributed as dist

    finite = torch.isfinite(total.detach()).to(torch.float32).reshape(1)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite)
