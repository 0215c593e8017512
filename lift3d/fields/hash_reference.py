"""The hash grid's reference math: the level layout and the plain-PyTorch lookup (Instant-NGP's definition).

The fast backends (``hash_triton`` on CUDA, ``hash_cpu`` on the CPU) and the dispatcher (``encodings.HashGrid``)
all import this module; the backends are tested against ``hash_grid_encode``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

# Instant-NGP's spatial hash: XOR of the integer vertex coordinates times these primes, mod table size
HASH_PRIMES = (1, 2654435761, 805459861)


@dataclass(frozen=True)
class HashGridLayout:
    """Where each level lives in the table and how it is indexed."""

    resolutions: tuple[int, ...]  # cells per axis of each level (vertices: resolution + 1)
    offsets: tuple[int, ...]  # first table row of each level
    sizes: tuple[int, ...]  # table rows of each level
    dense: tuple[bool, ...]  # True: the level's vertices fit the table and are indexed densely (no hashing)
    n_features: int  # features per level
    hashmap_size: int  # rows of a hashed level (a power of two)

    @property
    def n_levels(self) -> int:
        return len(self.resolutions)

    @property
    def n_rows(self) -> int:
        return self.offsets[-1] + self.sizes[-1]

    @property
    def output_dim(self) -> int:
        return self.n_levels * self.n_features


def hash_grid_layout(
    n_levels: int, n_features: int, log2_hashmap_size: int, base_resolution: int, per_level_scale: float
) -> HashGridLayout:
    """Level l has ``floor(base_resolution * per_level_scale**l)`` cells per axis; a level whose
    ``(resolution + 1)**3`` vertices fit in ``2**log2_hashmap_size`` rows is stored densely."""
    if n_levels < 1 or n_features < 1 or base_resolution < 1 or per_level_scale < 1.0:
        raise ValueError("hash grid needs n_levels >= 1, n_features_per_level >= 1, base_resolution >= 1, per_level_scale >= 1")
    if not 4 <= log2_hashmap_size <= 30:
        raise ValueError(f"log2_hashmap_size must be in 4..30, got {log2_hashmap_size}")
    hashmap_size = 2**log2_hashmap_size
    resolutions, offsets, sizes, dense = [], [], [], []
    offset = 0
    for level in range(n_levels):
        resolution = int(math.floor(base_resolution * per_level_scale**level + 1e-6))
        n_vertices = (resolution + 1) ** 3
        is_dense = n_vertices <= hashmap_size
        size = n_vertices if is_dense else hashmap_size
        size = (size + 7) // 8 * 8  # aligned rows
        resolutions.append(resolution)
        offsets.append(offset)
        sizes.append(size)
        dense.append(is_dense)
        offset += size
    return HashGridLayout(tuple(resolutions), tuple(offsets), tuple(sizes), tuple(dense), n_features, hashmap_size)


_CONSTANTS: dict[tuple, Tensor] = {}


def _constant(values: tuple, device: torch.device, dtype: torch.dtype) -> Tensor:
    """A small cached tensor (no host-to-device copy, hence no sync, after the first call on a device)."""
    key = (values, str(device), dtype)
    if key not in _CONSTANTS:
        with torch.inference_mode(False):  # a normal tensor, usable by autograd even if first made during evaluation
            _CONSTANTS[key] = torch.tensor(values, device=device, dtype=dtype)
    return _CONSTANTS[key]


def _corner_indices(layout: HashGridLayout, cells: Tensor, levels: list[int]) -> Tensor:
    """Table rows [N, len(levels), 2, 2, 2] of the 8 vertices of the cells ``cells`` [N, len(levels), 3]."""
    device = cells.device
    resolution = _constant(tuple(layout.resolutions[lv] for lv in levels), device, torch.long)[None, :]
    offset = _constant(tuple(layout.offsets[lv] for lv in levels), device, torch.long)[None, :, None, None, None]
    lo, hi = cells, cells + 1
    x = torch.stack([lo[..., 0], hi[..., 0]], -1)[:, :, :, None, None]  # [N, L, 2, 1, 1]
    y = torch.stack([lo[..., 1], hi[..., 1]], -1)[:, :, None, :, None]
    z = torch.stack([lo[..., 2], hi[..., 2]], -1)[:, :, None, None, :]
    if layout.dense[levels[0]]:
        stride = (resolution + 1)[..., None, None, None]
        index = x + y * stride + z * (stride * stride)
    else:
        index = (x * HASH_PRIMES[0]) ^ (y * HASH_PRIMES[1]) ^ (z * HASH_PRIMES[2])
        index = index & (layout.hashmap_size - 1)
    return index + offset


def hash_grid_encode(points: Tensor, table: Tensor, layout: HashGridLayout) -> Tensor:
    """Trilinearly interpolated features [N, L * F] of ``points`` [N, 3] in the unit cube (plain PyTorch).

    ``table`` is [n_rows, F]. Differentiable in the table and in the points (twice, for analytic
    normals in losses); gathers use ``torch.gather`` so the table gradient is an atomic scatter-add.
    """
    n = points.shape[0]
    out = []
    # dense and hashed levels are indexed differently: one vectorised pass over each group
    groups = [[lv for lv in range(layout.n_levels) if layout.dense[lv] == flag] for flag in (True, False)]
    order = []
    for levels in groups:
        if not levels:
            continue
        order += levels
        resolution = _constant(tuple(float(layout.resolutions[lv]) for lv in levels), points.device, points.dtype)
        scaled = points[:, None, :] * resolution[None, :, None]  # [N, Lg, 3]
        cells = torch.minimum(torch.floor(scaled).clamp_min(0), (resolution - 1)[None, :, None]).detach()
        frac = scaled - cells
        index = _corner_indices(layout, cells.long(), levels)  # [N, Lg, 2, 2, 2]
        wx = torch.stack([1 - frac[..., 0], frac[..., 0]], -1)[:, :, :, None, None]
        wy = torch.stack([1 - frac[..., 1], frac[..., 1]], -1)[:, :, None, :, None]
        wz = torch.stack([1 - frac[..., 2], frac[..., 2]], -1)[:, :, None, None, :]
        weights = (wx * wy * wz).reshape(n, len(levels), 8, 1)
        flat = index.reshape(-1, 1).expand(-1, layout.n_features)
        features = torch.gather(table, 0, flat).reshape(n, len(levels), 8, layout.n_features)
        out.append((features * weights.to(features.dtype)).sum(dim=2))  # [N, Lg, F]
    encoded = torch.cat(out, dim=1)
    if order != sorted(order):  # restore level order (dense levels always come first, so this is rare)
        encoded = encoded[:, torch.argsort(_constant(tuple(order), points.device, torch.long))]
    return encoded.reshape(n, layout.output_dim)
