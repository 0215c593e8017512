"""Tile intersections of projected Gaussians into buffers of a fixed size: the rasterizer's sort with no host read.

gsplat sizes its intersection list by reading the count on the host every render, so a training step waits for the
GPU there and cannot be captured as a CUDA graph. Here the list has ``capacity`` slots whatever the count: slots
past the count hold a sentinel key that sorts into one extra row of tiles below the image, which the rasterizer is
told to skip (``tile_masks``). The keys are gsplat's (tile id above the depth's float bits), so the sorted list is
the one gsplat would build, with the sentinels after it. Pure torch: the same code runs on the CPU in tests.
"""

from __future__ import annotations

import torch
from torch import Tensor


def tile_grid(width: int, height: int, tile_size: int) -> tuple[int, int]:
    """(tiles across, tiles down) covering the image, as gsplat counts them."""
    return -(-width // tile_size), -(-height // tile_size)


def tile_ranges(means2d: Tensor, radii: Tensor, tile_size: int, tile_width: int,
                tile_height: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each projected Gaussian's tiles [x0, x1) x [y0, y1) (int64, [..., N] each), clamped to the grid; empty where
    a radius is not positive. The float arithmetic is gsplat's, so both agree tile for tile."""
    center = means2d / float(tile_size)
    reach = radii.to(means2d.dtype) / float(tile_size)
    low, high = torch.floor(center - reach), torch.ceil(center + reach)
    visible = (radii > 0).all(dim=-1)
    ranges = []
    for axis, limit in ((0, tile_width), (1, tile_height)):  # scalar bounds: no tensor copied to the device
        start = low[..., axis].clamp(0, limit).long()
        end = torch.where(visible, high[..., axis].clamp(0, limit).long(), start)
        ranges += [start, end]
    return ranges[0], ranges[1], ranges[2], ranges[3]


def intersection_counts(means2d: Tensor, radii: Tensor, tile_size: int, tile_width: int, tile_height: int) -> Tensor:
    """How many (tile, Gaussian) pairs each image [...] holds: what a capacity must cover."""
    x0, x1, y0, y1 = tile_ranges(means2d, radii, tile_size, tile_width, tile_height)
    return ((x1 - x0) * (y1 - y0)).sum(dim=-1)


def tile_masks(n_images: int, tile_width: int, tile_height: int, device: torch.device) -> Tensor:
    """[I, tile_height + 1, tile_width] bool: True on the image's tiles, False on the extra row of sentinels."""
    masks = torch.ones(n_images, tile_height + 1, tile_width, dtype=torch.bool, device=device)
    masks[:, -1] = False
    return masks


def tile_intersections(means2d: Tensor, radii: Tensor, depths: Tensor, tile_size: int, tile_width: int,
                       tile_height: int, capacity: int) -> tuple[Tensor, Tensor, Tensor]:
    """Sorted (tile, Gaussian) pairs of I images of N Gaussians, in ``capacity`` slots.

    ``means2d`` [I, N, 2] pixels, ``radii`` [I, N, 2] (0: not visible), ``depths`` [I, N]. Returns ``offsets``
    [I, tile_height + 1, tile_width] int32 (each tile's first slot; the last row is the sentinels' and empty but
    for the last image's last tile), ``flatten_ids`` [capacity] int32 (index into I * N; meaningless in sentinel
    slots) and ``count``, a 0-dim int64 tensor: the pairs there were. Pairs past ``capacity`` are dropped, from the
    last Gaussians of the last image; a caller compares ``count`` with ``capacity`` to know (without waiting on it
    here)."""
    n_images, n = depths.shape
    device = depths.device
    rows = tile_height + 1
    ranges = tile_ranges(means2d, radii, tile_size, tile_width, tile_height)
    # one phantom Gaussian with no tiles at the end: every slot's owner is then a valid index, even with N = 0
    x0, x1, y0, y1 = (torch.cat([t.reshape(-1), t.new_zeros(1)]) for t in ranges)
    span = x1 - x0
    per_gaussian = span * (y1 - y0)
    ends = per_gaussian.cumsum(0)
    count = ends[-1]
    slot = torch.arange(capacity, device=device)
    owner = torch.searchsorted(ends, slot, right=True).clamp_max(n_images * n)
    local = slot - (ends[owner] - per_gaussian[owner])
    across = span[owner].clamp_min(1)
    tile_x, tile_y = x0[owner] + local % across, y0[owner] + local // across
    tile = ((owner // max(n, 1)) * rows + tile_y) * tile_width + tile_x
    depth_bits = torch.cat([depths.reshape(-1).contiguous().view(torch.int32).long() & 0xFFFFFFFF, x0.new_zeros(1)])
    sentinel = n_images * rows * tile_width - 1
    keys = torch.where(slot < count, (tile << 32) | depth_bits[owner], sentinel << 32)
    keys, order = torch.sort(keys)
    flatten_ids = owner[order].to(torch.int32)
    starts = torch.arange(n_images * rows * tile_width, device=device)
    offsets = torch.searchsorted(keys >> 32, starts).to(torch.int32).reshape(n_images, rows, tile_width)
    return offsets, flatten_ids, count
