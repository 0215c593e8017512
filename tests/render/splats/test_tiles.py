"""Tile intersections in fixed slots (lift3d/render/splats/tiles.py) against a brute-force listing per tile."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lift3d.render.splats.tiles import intersection_counts, tile_grid, tile_intersections, tile_masks


def _scene(n_images: int, n: int, width: int, height: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    means2d = torch.rand(n_images, n, 2, generator=g) * torch.tensor([width * 1.4, height * 1.4]) - torch.tensor(
        [width * 0.2, height * 0.2])
    radii = torch.randint(0, 30, (n_images, n, 2), generator=g, dtype=torch.int32)
    radii[torch.rand(n_images, n, generator=g) < 0.2] = 0  # culled Gaussians
    depths = torch.rand(n_images, n, generator=g) * 10 + 0.1
    return means2d, radii, depths


def _listing(means2d, radii, depths, tile_size, tile_width, tile_height):
    """{(image, tile index): Gaussian flat ids front to back}, one Gaussian and tile at a time (float32 as gsplat)."""
    pairs: dict[tuple[int, int], list[tuple[float, int]]] = {}
    m, r, d = means2d.numpy(), radii.numpy(), depths.numpy()
    n_images, n = d.shape
    ts = np.float32(tile_size)
    for i in range(n_images):
        for k in range(n):
            if r[i, k, 0] <= 0 or r[i, k, 1] <= 0:
                continue
            cx, cy = m[i, k, 0] / ts, m[i, k, 1] / ts
            rx, ry = np.float32(r[i, k, 0]) / ts, np.float32(r[i, k, 1]) / ts
            x0, x1 = (min(max(0, int(math.floor(cx - rx))), tile_width), min(max(0, int(math.ceil(cx + rx))), tile_width))
            y0, y1 = (min(max(0, int(math.floor(cy - ry))), tile_height), min(max(0, int(math.ceil(cy + ry))), tile_height))
            for ty in range(y0, y1):
                for tx in range(x0, x1):
                    pairs.setdefault((i, ty * tile_width + tx), []).append((float(d[i, k]), i * n + k))
    return {key: [g for _, g in sorted(v)] for key, v in pairs.items()}


def _per_tile(offsets, flatten_ids, count, tile_width, tile_height):
    n_images = offsets.shape[0]
    rows = tile_height + 1
    flat = offsets.reshape(-1).tolist() + [len(flatten_ids)]
    found = {}
    for i in range(n_images):
        for t in range(tile_height * tile_width):
            start, end = flat[i * rows * tile_width + t], flat[i * rows * tile_width + t + 1]
            if end > start:
                found[(i, t)] = flatten_ids[start:end].tolist()
    return found


@pytest.mark.parametrize("n_images", [1, 3])
def test_fixed_slots_list_every_tile_front_to_back(n_images):
    width, height, tile_size = 75, 50, 16
    tile_width, tile_height = tile_grid(width, height, tile_size)
    means2d, radii, depths = _scene(n_images, 60, width, height)
    expected = _listing(means2d, radii, depths, tile_size, tile_width, tile_height)
    total = sum(len(v) for v in expected.values())
    capacity = total + 37
    offsets, flatten_ids, count = tile_intersections(means2d, radii, depths, tile_size, tile_width, tile_height, capacity)
    assert int(count) == total
    assert offsets.shape == (n_images, tile_height + 1, tile_width) and offsets.dtype == torch.int32
    assert flatten_ids.shape == (capacity,) and flatten_ids.dtype == torch.int32
    assert _per_tile(offsets, flatten_ids, count, tile_width, tile_height) == expected
    # the sentinel row is empty but for the last image's last tile, which holds the unused slots
    assert int(offsets.reshape(-1)[-1]) == total
    assert torch.equal(intersection_counts(means2d, radii, tile_size, tile_width, tile_height),
                       torch.tensor([sum(len(v) for (i, _), v in expected.items() if i == j) for j in range(n_images)]))


def test_overflow_is_reported_and_drops_only_the_last_pairs():
    width, height, tile_size = 64, 64, 16
    tile_width, tile_height = tile_grid(width, height, tile_size)
    means2d, radii, depths = _scene(1, 40, width, height, seed=3)
    total = int(intersection_counts(means2d, radii, tile_size, tile_width, tile_height).sum())
    capacity = total // 2
    offsets, flatten_ids, count = tile_intersections(means2d, radii, depths, tile_size, tile_width, tile_height, capacity)
    assert int(count) == total > capacity  # the caller sees the overflow
    kept = _per_tile(offsets, flatten_ids, count, tile_width, tile_height)
    assert sum(len(v) for v in kept.values()) == capacity
    full = _listing(means2d, radii, depths, tile_size, tile_width, tile_height)
    for key, ids in kept.items():  # what is kept is in order, a subsequence of the full list
        order = [g for g in full[key] if g in ids]
        assert ids == order


def test_no_visible_gaussians_and_no_gaussians():
    means2d, radii, depths = _scene(2, 5, 32, 32)
    radii.zero_()
    offsets, flatten_ids, count = tile_intersections(means2d, radii, depths, 16, 2, 2, 8)
    assert int(count) == 0 and torch.all(offsets == 0)
    empty = tile_intersections(torch.zeros(1, 0, 2), torch.zeros(1, 0, 2, dtype=torch.int32), torch.zeros(1, 0), 16, 2, 2, 4)
    assert int(empty[2]) == 0 and torch.all(empty[0] == 0)


def test_masks_skip_only_the_sentinel_row():
    masks = tile_masks(2, 3, 4, torch.device("cpu"))
    assert masks.shape == (2, 5, 3)
    assert masks[:, :4].all() and not masks[:, 4].any()
