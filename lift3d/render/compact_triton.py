"""Compaction into a fixed budget (``sampling.compact`` with a budget) with its scatter as one Triton kernel on CUDA.

The PyTorch form writes every candidate's slot (its position among the selected, or a spare slot) as int64, then
scatters an ``arange`` of all candidates through them: over the 16.8M marching candidates of each chunk of an
MVDream 256 step, eight chunks a step, that is four full-length passes. Here a running count of the mask (int32)
is the only full-length tensor; the kernel reads it with the mask and writes the index of each selected candidate
that fits straight into its slot. The result is the PyTorch one exactly (compared once per GPU before use).
"""

import torch
from torch import Tensor

from lift3d.triton_checks import checked_once

# no ``from __future__ import annotations`` here: Triton 3.0 reads the ``tl.constexpr`` annotations as objects

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA builds of torch
    triton = None

BLOCK = 1024  # candidates per program

if triton is not None:

    @triton.jit
    def _place_kernel(mask, running, out, n, budget, BLOCK_SIZE: tl.constexpr):
        """``out[running[i] - 1] = i`` for each selected candidate i whose slot is inside the budget."""
        index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        inside = index < n
        selected = tl.load(mask + index, mask=inside, other=0) != 0
        slot = tl.load(running + index, mask=inside, other=1) - 1
        tl.store(out + slot, index, mask=inside & selected & (slot < budget))


def place(mask: Tensor, budget: int) -> tuple[Tensor, Tensor]:
    """Slots [budget] (the index of the selected candidate in each, ``n`` where none) and the running count [n] of
    ``mask`` [n] (bool), by the kernel."""
    n = mask.shape[0]
    running = torch.cumsum(mask, dim=0, dtype=torch.int32)
    slots = torch.full((budget,), n, dtype=torch.long, device=mask.device)
    if n:
        _place_kernel[(triton.cdiv(n, BLOCK),)](mask.view(torch.uint8), running, slots, n, budget, BLOCK_SIZE=BLOCK)
    return slots, running


_CHECKED: dict[torch.device, bool] = {}


def available(device: torch.device) -> bool:
    """Whether the kernel runs on ``device`` and passed its comparison with the PyTorch compaction there."""
    return triton is not None and checked_once(_CHECKED, device, compare, "Triton compaction", "the PyTorch ops")


def compare(device: torch.device) -> None:
    """Raise unless the kernel's compaction is the PyTorch one (budgets below, at and above the selected count)."""
    from lift3d.render.sampling import compact

    generator = torch.Generator(device=device).manual_seed(0)
    mask = torch.rand(5000, device=device, generator=generator) < 0.3
    count = int(mask.sum())
    for budget in (count // 2, count, count + 100):
        fast, reference = compact(mask, budget, fused=True), compact(mask, budget, fused=False)
        for a, b in ((fast.index, reference.index), (fast.valid, reference.valid), (fast.dropped, reference.dropped)):
            if not torch.equal(a, b):
                raise RuntimeError("the Triton compaction differs from the PyTorch ops")
