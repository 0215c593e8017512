"""Tile binning for the torch rasterizer: which Gaussians each tile composites, front to back, and
how tiles are grouped into chunks of bounded size; plus the tile <-> image layout conversions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lift3d.render.splats.project import Projection


@dataclass
class TileBins:
    """Which Gaussians each tile composites, front to back, and the chunks tiles are processed in."""

    tile_size: int
    tiles_x: int
    tiles_y: int
    n_cameras: int
    flat_ids: Tensor  # [M] camera * N + gaussian, grouped by tile, front to back within a tile
    tile_of: Tensor  # [M] the tile of each entry of flat_ids
    offsets: Tensor  # [C * tiles_y * tiles_x] start of each tile's run in flat_ids
    counts: Tensor  # [C * tiles_y * tiles_x] length of each tile's run
    chunks: list[tuple[Tensor, int]]  # (tile indices [n], padded Gaussians per tile K)


def bin_gaussians(proj: Projection, width: int, height: int, tile_size: int, chunk_elements: int) -> TileBins:
    """Assign visible Gaussians to tiles, sorted by depth within each tile (ties: lower index first)."""
    C, N = proj.depths.shape
    device = proj.depths.device
    tiles_x, tiles_y = -(-width // tile_size), -(-height // tile_size)
    n_tiles = C * tiles_x * tiles_y
    with torch.no_grad():
        cam, gid = torch.nonzero(proj.visible, as_tuple=True)
        order = torch.argsort(proj.depths[cam, gid], stable=True)
        cam, gid = cam[order], gid[order]
        mean = proj.means2d[cam, gid].detach()
        radius = proj.radii[cam, gid].to(mean.dtype)
        lo = torch.floor((mean - radius) / tile_size).long()
        hi = torch.ceil((mean + radius) / tile_size).long()
        lo[:, 0].clamp_(0, tiles_x), hi[:, 0].clamp_(0, tiles_x)
        lo[:, 1].clamp_(0, tiles_y), hi[:, 1].clamp_(0, tiles_y)
        span = (hi - lo).clamp_min(0)
        per_gaussian = span[:, 0] * span[:, 1]
        owner = torch.repeat_interleave(torch.arange(len(cam), device=device), per_gaussian)
        first = torch.cumsum(per_gaussian, 0) - per_gaussian
        local = torch.arange(len(owner), device=device) - first[owner]
        width_in_tiles = span[owner, 0]
        tx = lo[owner, 0] + local % width_in_tiles.clamp_min(1)
        ty = lo[owner, 1] + local // width_in_tiles.clamp_min(1)
        tile = (cam[owner] * tiles_y + ty) * tiles_x + tx
        tile, by_tile = torch.sort(tile, stable=True)
        flat_ids = (cam * N + gid)[owner[by_tile]]
        counts = torch.bincount(tile, minlength=n_tiles)
        offsets = torch.cumsum(counts, 0) - counts
        chunks = _plan_chunks(counts, tile_size * tile_size, chunk_elements)
    return TileBins(tile_size, tiles_x, tiles_y, C, flat_ids, tile, offsets, counts, chunks)


def _plan_chunks(counts: Tensor, pixels_per_tile: int, chunk_elements: int,
                 min_elements: int = 1 << 15, max_padding: float = 1.25) -> list[tuple[Tensor, int]]:
    """Group non-empty tiles, sorted by count, into chunks of <= chunk_elements pixel-Gaussian pairs.

    A chunk pads every tile to its largest count, so a new chunk also starts once counts grow by more
    than ``max_padding`` (unless the chunk is still smaller than ``min_elements``: tiny chunks cost
    more in per-call overhead than padding does)."""
    occupied = torch.nonzero(counts > 0).squeeze(1)
    if len(occupied) == 0:
        return []
    sorted_counts, order = torch.sort(counts[occupied])
    tiles, values = occupied[order], sorted_counts.tolist()
    chunks, start = [], 0
    for end in range(1, len(values) + 1):
        size = (end - start) * pixels_per_tile * values[end - 1]
        if (end == len(values) or (end + 1 - start) * pixels_per_tile * values[end] > chunk_elements
                or (size >= min_elements and values[end] > max_padding * values[start])):
            chunks.append((tiles[start:end], int(values[end - 1])))
            start = end
    return chunks


def tile_origins(tiles: Tensor, bins: TileBins, dtype: torch.dtype) -> Tensor:
    """Top-left pixel corner [n, 2] (x, y) of each of ``tiles``."""
    per_camera = bins.tiles_x * bins.tiles_y
    rest = tiles % per_camera
    return torch.stack([rest % bins.tiles_x, rest // bins.tiles_x], dim=-1).to(dtype) * bins.tile_size


def tile_lists(bins: TileBins, tiles: Tensor, K: int) -> Tensor:
    """Positions [n, K] in ``flat_ids`` of each tile's list, padded with M (one past the end)."""
    rank = torch.arange(K, device=tiles.device)
    index = bins.offsets[tiles][:, None] + rank[None]
    return torch.where(rank[None] < bins.counts[tiles][:, None], index, torch.full_like(index, len(bins.flat_ids)))


def to_image(tiles_data: Tensor, bins: TileBins, width: int, height: int) -> Tensor:
    """[C * tiles, P, D] tile layout -> [C, H, W, D] image."""
    ts, D = bins.tile_size, tiles_data.shape[-1]
    image = tiles_data.reshape(bins.n_cameras, bins.tiles_y, bins.tiles_x, ts, ts, D).permute(0, 1, 3, 2, 4, 5)
    return image.reshape(bins.n_cameras, bins.tiles_y * ts, bins.tiles_x * ts, D)[:, :height, :width]


def to_tiles(image: Tensor, bins: TileBins) -> Tensor:
    """[C, H, W, D] image -> [C * tiles, P, D] tile layout (zero-padded at the borders)."""
    ts, (C, H, W, D) = bins.tile_size, image.shape
    padded = image.new_zeros(C, bins.tiles_y * ts, bins.tiles_x * ts, D)
    padded[:, :H, :W] = image
    tiles = padded.reshape(C, bins.tiles_y, ts, bins.tiles_x, ts, D).permute(0, 1, 3, 2, 4, 5)
    return tiles.reshape(C * bins.tiles_y * bins.tiles_x, ts * ts, D)
