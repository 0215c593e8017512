"""SSIM's Gaussian blur on CUDA as two 1-D Triton passes (rows, then columns), the fast path of ``metrics.ssim``.

cuDNN runs SSIM's 11x11 grouped convolution and its input gradient with a slow direct kernel (benchmarks/RESULTS.md).
The window is the outer product of a 1-D Gaussian, so each output is 2 x 11 taps instead of 121, and the gradient
is the same blur with the taps reversed (zero padding, as ``F.conv2d(..., padding=radius)``). Tested against
``F.conv2d`` on the CPU under ``TRITON_INTERPRET=1``; ``available`` compares the two once on the GPU first.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.triton_checks import checked_once

# no ``from __future__ import annotations`` here: Triton 3.0 reads the ``tl.constexpr`` annotations as objects

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA builds of torch
    triton = None

BLOCK = (16, 64)  # rows x columns of output per program (a 400-wide image: 7 column blocks)

if triton is not None:

    @triton.jit
    def _blur_pass(src, dst, taps, height, width, RADIUS: tl.constexpr, ALONG_ROWS: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
        """One 1-D correlation with ``2 * RADIUS + 1`` taps along each row (or column) of one [H, W] plane, zero
        outside the plane."""
        rows = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
        cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]
        base = tl.program_id(2).to(tl.int64) * height * width
        inside = (rows < height) & (cols < width)
        total = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
        for k in tl.static_range(2 * RADIUS + 1):
            tap = tl.load(taps + k)
            if ALONG_ROWS:
                shifted = cols + (k - RADIUS)
                keep = inside & (shifted >= 0) & (shifted < width)
                value = tl.load(src + base + rows * width + shifted, mask=keep, other=0.0)
            else:
                shifted = rows + (k - RADIUS)
                keep = inside & (shifted >= 0) & (shifted < height)
                value = tl.load(src + base + shifted * width + cols, mask=keep, other=0.0)
            total += tap * value.to(tl.float32)
        tl.store(dst + base + rows * width + cols, total, mask=inside)


def separable_blur(maps: Tensor, taps: Tensor) -> Tensor:
    """``maps`` [B, C, H, W] (float32, CUDA or the interpreter) correlated with ``outer(taps, taps)`` per channel,
    zero-padded to the same size: ``F.conv2d(maps, outer, padding=len(taps) // 2, groups=C)``."""
    maps = maps.contiguous()
    batch, channels, height, width = maps.shape
    radius = len(taps) // 2
    grid = (triton.cdiv(height, BLOCK[0]), triton.cdiv(width, BLOCK[1]), batch * channels)
    across = torch.empty_like(maps)
    _blur_pass[grid](maps, across, taps, height, width, RADIUS=radius, ALONG_ROWS=True, BLOCK_H=BLOCK[0],
                     BLOCK_W=BLOCK[1])
    out = torch.empty_like(maps)
    _blur_pass[grid](across, out, taps, height, width, RADIUS=radius, ALONG_ROWS=False, BLOCK_H=BLOCK[0],
                     BLOCK_W=BLOCK[1])
    return out


class SeparableBlur(torch.autograd.Function):
    """``separable_blur`` with its gradient: the adjoint of a zero-padded correlation is the correlation with the
    taps reversed."""

    @staticmethod
    def forward(ctx, maps: Tensor, taps: Tensor) -> Tensor:  # noqa: D102
        ctx.save_for_backward(taps)
        return separable_blur(maps, taps)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # noqa: D102
        (taps,) = ctx.saved_tensors
        return separable_blur(grad, taps.flip(0)), None


_checked: dict[torch.device, bool] = {}


def available(device: torch.device) -> bool:
    """Whether the Triton blur runs on ``device`` and equals ``F.conv2d`` there (checked once per device, never
    inside a CUDA graph capture; a failure is logged and the convolution is used)."""
    return triton is not None and checked_once(_checked, device, _compare, "Triton blur for SSIM", "the convolution")


def _compare(device: torch.device) -> None:
    """Raise unless the Triton blur of random maps (with a ragged edge in both directions) equals ``F.conv2d``."""
    generator = torch.Generator(device=device).manual_seed(0)
    maps = torch.rand(2, 3, 37, 83, device=device, generator=generator)
    taps = torch.tensor([0.1, 0.2, 0.4, 0.2, 0.1], device=device)
    window = (taps[:, None] * taps[None, :]).expand(3, 1, 5, 5)
    want = F.conv2d(maps, window, padding=2, groups=3)
    error = float((separable_blur(maps, taps) - want).abs().max())
    if error > 1e-5:
        raise RuntimeError(f"it differs from the convolution by {error:.3g}")
