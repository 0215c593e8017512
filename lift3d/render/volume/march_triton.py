"""Occupancy-grid marching candidates on CUDA as one Triton kernel, the fast path of the volume renderer's march.

The march asks, for every ray and every fixed step along it, whether the step exists (``hi > lo``) and whether
its midpoint lies in an occupied cell of the grid. Written as PyTorch ops this is some twenty kernels over
[rays, steps] tensors of intervals, midpoints and cell indices. This kernel computes the
same arithmetic per candidate in registers and writes only the answer, one byte each; the intervals of the
candidates kept are computed afterwards from their (ray, step) by ``sampling.step_bounds``, the same formula.

Bounded fields only (no contraction, fixed steps). The operations and their order are those of
``sampling.step_bounds``, ``contraction.to_unit_cube`` and ``OccupancyGrid.cell_index``, with fused multiply-adds
off, so the mask is the PyTorch one: exactly in Triton's interpreter on the CPU (tested), and on a GPU for all
but about one candidate in a million, a midpoint within rounding of a cell's face that the GPU's float division
puts on the other side (either side is a valid march). ``available``
compares the two once on the GPU before the fast path is used.
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
    def _occupied_steps_kernel(rays_o, rays_d, t_near, t_far, jitter, occupied, bbox, out, n_candidates, n_steps,
                               step_size, resolution, BLOCK_SIZE: tl.constexpr):
        """``out[r * n_steps + k]`` = 1 where step k of ray r exists and its midpoint is in an occupied cell."""
        index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        inside_range = index < n_candidates
        ray = index // n_steps
        k = (index - ray * n_steps).to(tl.float32)
        near = tl.load(t_near + ray, mask=inside_range, other=0.0)
        far = tl.load(t_far + ray, mask=inside_range, other=0.0)
        offset = tl.load(jitter + ray, mask=inside_range, other=0.0)
        lo = tl.maximum(near, near + (k - 1.0 + offset) * step_size)
        hi = tl.minimum(far, near + (k + offset) * step_size)
        mid = 0.5 * (lo + hi)
        keep = inside_range & (hi > lo)
        cell = tl.zeros((BLOCK_SIZE,), dtype=tl.int64)
        for axis in tl.static_range(3):
            origin = tl.load(rays_o + ray * 3 + axis, mask=inside_range, other=0.0)
            direction = tl.load(rays_d + ray * 3 + axis, mask=inside_range, other=0.0)
            low = tl.load(bbox + axis)
            high = tl.load(bbox + 3 + axis)
            unit = (origin + direction * mid - low) / (high - low)
            keep = keep & (unit >= 0.0) & (unit <= 1.0)
            c = (unit * resolution).to(tl.int64)  # truncates, as torch's .long()
            c = tl.minimum(tl.maximum(c, 0), resolution - 1)
            cell = cell * resolution + c
        flag = tl.load(occupied + cell, mask=keep, other=0)
        tl.store(out + index, (keep & (flag != 0)).to(tl.int8), mask=inside_range)


def occupied_steps(rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, jitter: Tensor, step_size: float,
                   n_steps: int, occupied: Tensor, bbox: Tensor, resolution: int) -> Tensor:
    """Bool [R, n_steps]: step k of ray r (``sampling.step_bounds`` without disparity) is non-empty and its midpoint
    lies inside ``bbox`` [2, 3] in a cell of ``occupied`` (flat [resolution^3], i slowest)."""
    n_rays = rays_o.shape[0]
    out = torch.empty(n_rays, n_steps, dtype=torch.int8, device=rays_o.device)
    n = n_rays * n_steps
    if n:
        grid = (triton.cdiv(n, BLOCK),)
        _occupied_steps_kernel[grid](rays_o.float().contiguous(), rays_d.float().contiguous(), t_near.float().contiguous(),
                                     t_far.float().contiguous(), jitter.float().contiguous(), occupied.view(torch.uint8),
                                     bbox.float().contiguous(), out, n, n_steps, float(step_size), resolution,
                                     BLOCK_SIZE=BLOCK, num_warps=4, enable_fp_fusion=False)
    return out.view(torch.bool)


_checked: dict[torch.device, bool] = {}


def available(device: torch.device) -> bool:
    """Whether the kernel runs on ``device`` and equals the PyTorch march there (checked once per device, never
    inside a CUDA graph capture; a failure is logged and the PyTorch ops are used)."""
    return triton is not None and checked_once(_checked, device, _check, "Triton occupancy march", "the PyTorch ops")


def _check(device: torch.device) -> None:
    mismatches = compare(device)
    if mismatches:
        raise RuntimeError(f"{mismatches} of its candidates differ from the PyTorch march")


def reference_steps(rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, jitter: Tensor, step_size: float,
                    n_steps: int, occupied: Tensor, bbox: Tensor, resolution: int) -> Tensor:
    """The same mask from PyTorch ops (the renderer's CPU path): what the kernel is checked against."""
    from lift3d.render.volume.occupancy import OccupancyGrid, OccupancyGridConfig
    from lift3d.render.volume.sampling import step_bounds

    k = torch.arange(n_steps, device=rays_o.device, dtype=rays_o.dtype)
    lo, hi = step_bounds(t_near[:, None], t_far[:, None], jitter[:, None], step_size, k[None, :])
    points = rays_o[:, None, :] + rays_d[:, None, :] * (0.5 * (lo + hi))[..., None]
    grid = OccupancyGrid(OccupancyGridConfig(resolution=resolution), bbox).to(rays_o.device)
    grid.occupied.copy_(occupied)
    return (hi > lo) & grid.query(points.reshape(-1, 3)).reshape(lo.shape)


def compare(device: torch.device, n_rays: int = 333, n_steps: int = 97, resolution: int = 16) -> int:
    """Candidates where the kernel and ``reference_steps`` disagree, on random rays through a random grid (rays
    from outside the box, some missing it, steps that end mid-way)."""
    from lift3d.render.volume.sampling import ray_box

    generator = torch.Generator(device=device).manual_seed(0)
    bbox = torch.tensor([[-1.0, -0.8, -1.2], [1.0, 0.9, 1.1]], device=device)
    rays_o = (torch.rand(n_rays, 3, device=device, generator=generator) - 0.5) * 6.0
    target = (torch.rand(n_rays, 3, device=device, generator=generator) - 0.5) * 2.5
    rays_d = torch.nn.functional.normalize(target - rays_o, dim=-1)
    t_near, t_far = ray_box(rays_o, rays_d, bbox)
    jitter = 1.0 - torch.rand(n_rays, device=device, generator=generator)
    occupied = torch.rand(resolution**3, device=device, generator=generator) < 0.4
    step_size = 3.6 / (n_steps - 8)
    args = (rays_o, rays_d, t_near, t_far, jitter, step_size, n_steps, occupied, bbox, resolution)
    return int((occupied_steps(*args) != reference_steps(*args)).sum())
