"""Packing the renderer's samples on CUDA as Triton kernels: budgeted compaction and the gather of kept rows.

**Compaction into a fixed budget** (``sampling.compact`` with a budget): the PyTorch form writes an int64 slot for
every candidate and scatters an ``arange`` through them (four full-length passes). Here a running count of the mask
(int32) is the only full-length tensor; ``place`` writes the index of each selected candidate that fits straight into
its slot: the PyTorch result exactly.

**Rows at given indices** (``source[index]``), the gather of the hash-grid features the density-only pass keeps for
the full pass: PyTorch's gather kernel is slow for narrow rows; here a program copies a block of whole rows, each a
contiguous load.

Each kernel is compared with the PyTorch ops once per GPU before use (``triton_checks.checked_once``): the gather
here, the compaction beside ``compact`` (``sampling.compaction_available``), so this module imports no sampling code.
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

BLOCK = 1024  # candidates per program of the compaction
ROWS = 128  # rows per program of the gather

if triton is not None:

    @triton.jit
    def _place_kernel(mask, running, out, n, budget, BLOCK_SIZE: tl.constexpr):
        """``out[running[i] - 1] = i`` for each selected candidate i whose slot is inside the budget."""
        index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        inside = index < n
        selected = tl.load(mask + index, mask=inside, other=0) != 0
        slot = tl.load(running + index, mask=inside, other=1) - 1
        tl.store(out + slot, index, mask=inside & selected & (slot < budget))


    @triton.jit
    def _take_rows_kernel(source, index, out, n_rows, COLUMNS: tl.constexpr, BLOCK: tl.constexpr):
        """``out[i] = source[index[i]]`` for a block of rows i."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = rows < n_rows
        columns = tl.arange(0, COLUMNS)
        taken = tl.load(index + rows, mask=inside, other=0).to(tl.int64)
        values = tl.load(source + taken[:, None] * COLUMNS + columns[None, :], mask=inside[:, None])
        tl.store(out + rows[:, None] * COLUMNS + columns[None, :], values, mask=inside[:, None])


def place(mask: Tensor, budget: int) -> tuple[Tensor, Tensor]:
    """Slots [budget] (the index of the selected candidate in each, ``n`` where none) and the running count [n] of
    ``mask`` [n] (bool), by the kernel."""
    n = mask.shape[0]
    running = torch.cumsum(mask, dim=0, dtype=torch.int32)
    slots = torch.full((budget,), n, dtype=torch.long, device=mask.device)
    if n:
        _place_kernel[(triton.cdiv(n, BLOCK),)](mask.view(torch.uint8), running, slots, n, budget, BLOCK_SIZE=BLOCK)
    return slots, running


def take_rows_triton(source: Tensor, index: Tensor) -> Tensor:
    """``source[index]`` for a contiguous [N, C] ``source`` (C a power of two) and a 1-D ``index``, by the kernel."""
    out = torch.empty((index.shape[0], source.shape[1]), dtype=source.dtype, device=source.device)
    if index.shape[0]:
        _take_rows_kernel[(triton.cdiv(index.shape[0], ROWS),)](source, index, out, index.shape[0],
                                                                COLUMNS=source.shape[1], BLOCK=ROWS)
    return out


def _fits(source: Tensor, index: Tensor) -> bool:
    """Whether the row gather kernel takes these: contiguous CUDA rows of a power-of-two width, no gradient."""
    if triton is None or not source.is_cuda or source.ndim != 2 or index.ndim != 1:
        return False
    columns = source.shape[1]
    return source.is_contiguous() and columns > 0 and columns & (columns - 1) == 0 and not source.requires_grad


def take_rows(source: Tensor, index: Tensor) -> Tensor:
    """``source[index]`` (rows of a 2-D tensor, no gradient): the kernel where it applies and passed its check."""
    if _fits(source, index) and checked_once(_GATHER_CHECKED, source.device, compare_gather, "Triton row gather", "index_select"):
        return take_rows_triton(source, index)
    return torch.index_select(source, 0, index)


_GATHER_CHECKED: dict[torch.device, bool] = {}


def compare_gather(device: torch.device) -> None:
    """Raise unless the kernel gives ``index_select``'s rows (half and float, repeated and unsorted indices)."""
    generator = torch.Generator(device=device).manual_seed(0)
    for dtype, columns in ((torch.float16, 32), (torch.float32, 4)):
        source = torch.randn(1000, columns, device=device, generator=generator).to(dtype)
        index = torch.randint(0, 1000, (777,), device=device, generator=generator)
        if not torch.equal(take_rows_triton(source, index), torch.index_select(source, 0, index)):
            raise RuntimeError("the Triton row gather differs from index_select")
