"""Rows of a 2-D tensor at given indices (``source[index]``) as a Triton kernel on CUDA, the renderer's gather of
the hash-grid features its density-only pass keeps for the full pass.

PyTorch's indexing, ``index_select`` and ``embedding`` all reach one gather kernel that on an H100 moved 2.3M rows
of 64 bytes (32 half features) in 1.4 ms, about 0.2 TB/s: 22 ms of an MVDream step, as much as the lookup it
spares. Here a program copies a block of whole rows, each a contiguous load. Any other shape or device uses
``index_select``, and the kernel is compared with it once per GPU before use.
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

ROWS = 128  # rows per program

if triton is not None:

    @triton.jit
    def _take_rows_kernel(source, index, out, n_rows, COLUMNS: tl.constexpr, BLOCK: tl.constexpr):
        """``out[i] = source[index[i]]`` for a block of rows i."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = rows < n_rows
        columns = tl.arange(0, COLUMNS)
        taken = tl.load(index + rows, mask=inside, other=0).to(tl.int64)
        values = tl.load(source + taken[:, None] * COLUMNS + columns[None, :], mask=inside[:, None])
        tl.store(out + rows[:, None] * COLUMNS + columns[None, :], values, mask=inside[:, None])


def take_rows_triton(source: Tensor, index: Tensor) -> Tensor:
    """``source[index]`` for a contiguous [N, C] ``source`` (C a power of two) and a 1-D ``index``, by the kernel."""
    out = torch.empty((index.shape[0], source.shape[1]), dtype=source.dtype, device=source.device)
    if index.shape[0]:
        _take_rows_kernel[(triton.cdiv(index.shape[0], ROWS),)](source, index, out, index.shape[0],
                                                                COLUMNS=source.shape[1], BLOCK=ROWS)
    return out


def _fits(source: Tensor, index: Tensor) -> bool:
    columns = source.shape[1] if source.ndim == 2 else 0
    return (triton is not None and source.is_cuda and source.ndim == 2 and source.is_contiguous() and index.ndim == 1
            and columns > 0 and columns & (columns - 1) == 0 and not source.requires_grad)


def take_rows(source: Tensor, index: Tensor) -> Tensor:
    """``source[index]`` (rows of a 2-D tensor, no gradient): the kernel where it applies and passed its check."""
    if _fits(source, index) and checked_once(_CHECKED, source.device, compare, "Triton row gather", "index_select"):
        return take_rows_triton(source, index)
    return torch.index_select(source, 0, index)


_CHECKED: dict[torch.device, bool] = {}


def compare(device: torch.device) -> None:
    """Raise unless the kernel gives ``index_select``'s rows (half and float, repeated and unsorted indices)."""
    generator = torch.Generator(device=device).manual_seed(0)
    for dtype, columns in ((torch.float16, 32), (torch.float32, 4)):
        source = torch.randn(1000, columns, device=device, generator=generator).to(dtype)
        index = torch.randint(0, 1000, (777,), device=device, generator=generator)
        if not torch.equal(take_rows_triton(source, index), torch.index_select(source, 0, index)):
            raise RuntimeError("the Triton row gather differs from index_select")
