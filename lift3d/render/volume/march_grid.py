"""Occupancy-grid marching candidates (Instant-NGP): fixed steps along each ray, kept where the step's midpoint lies
in an occupied cell, compacted into packed arrays; by PyTorch ops, or on CUDA by one Triton kernel (``march_triton``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.render.volume.occupancy import OccupancyGrid
from lift3d.render.volume.sampling import Packed, compact, step_bounds


def grid_candidates(rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, jitter: Tensor, step_size: float,
                    n_steps: int, disparity_from: float, occupancy: OccupancyGrid) -> tuple[Tensor, Tensor, Tensor]:
    """Intervals ``lo``, ``hi`` [R, n_steps] of every marching step of rays [R, 3] and the candidates ``mask``
    [R, n_steps]: the step exists (``hi > lo``) and, with the grid enabled, its midpoint is in an occupied cell."""
    n_rays = rays_o.shape[0]
    k = torch.arange(n_steps, device=rays_o.device, dtype=rays_o.dtype)
    lo, hi = step_bounds(t_near[:, None], t_far[:, None], jitter[:, None], step_size, k[None, :], disparity_from)
    mask = hi > lo
    if occupancy.cfg.enabled:
        mid = 0.5 * (lo + hi)
        points = rays_o[:, None, :] + rays_d[:, None, :] * mid[..., None]
        mask = mask & occupancy.query(points.reshape(-1, 3)).reshape(n_rays, n_steps)
    return lo, hi, mask


def compact_candidates(mask: Tensor, lo: Tensor, hi: Tensor, budget: int | None) -> tuple[Packed, Tensor, Tensor, Tensor]:
    """The candidates of ``mask`` [R, K] packed (exactly, or into ``budget`` slots): the compaction, and the ray [S]
    and interval ``lo``, ``hi`` [S] of each packed entry."""
    first = compact(mask.reshape(-1), budget)
    ray = torch.div(first.index, mask.shape[1], rounding_mode="floor")
    return first, ray, lo.reshape(-1)[first.index], hi.reshape(-1)[first.index]


def packed_intervals(index: Tensor, n_steps: int, t_near: Tensor, t_far: Tensor, jitter: Tensor,
                     step_size: float) -> tuple[Tensor, Tensor, Tensor]:
    """Ray [S] and interval ``lo``, ``hi`` [S] of the flat candidates ``index`` [S] (ray-major, ``n_steps`` a ray), by
    ``step_bounds`` with fixed steps: the kernel's candidates get their intervals only where kept."""
    ray = torch.div(index, n_steps, rounding_mode="floor")
    k = (index - ray * n_steps).to(t_near.dtype)
    lo, hi = step_bounds(t_near[ray], t_far[ray], jitter[ray], step_size, k)
    return ray, lo, hi


def kernel_applies(mode: str, device: torch.device, unbounded: bool, occupancy: OccupancyGrid,
                   disparity_from: float) -> bool:
    """Whether the Triton kernel gives the candidates (``fused_march`` auto): CUDA, the grid enabled, a bounded field
    with fixed steps, and the kernel passed its check on this GPU."""
    if mode == "never" or device.type != "cuda" or unbounded:
        return False
    if not occupancy.cfg.enabled or disparity_from > 0:
        return False
    from lift3d.render.volume import march_triton

    return march_triton.available(device)


def kernel_candidates(rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, jitter: Tensor, step_size: float,
                      n_steps: int, occupancy: OccupancyGrid,
                      budget: int | None) -> tuple[Tensor, Packed, Tensor, Tensor, Tensor]:
    """``grid_candidates`` then ``compact_candidates`` with the mask from the kernel: the mask [R, n_steps], the
    compaction, and ray, ``lo``, ``hi`` [S] of the packed entries."""
    from lift3d.render.volume import march_triton

    mask = march_triton.occupied_steps(rays_o, rays_d, t_near, t_far, jitter, step_size, n_steps,
                                       occupancy.occupied, occupancy.bbox, occupancy.resolution)
    first = compact(mask.reshape(-1), budget)
    ray, lo, hi = packed_intervals(first.index, n_steps, t_near, t_far, jitter, step_size)
    return mask, first, ray, lo, hi
