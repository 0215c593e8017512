"""A set of 3D Gaussians as a density and color field, so it can be meshed like a NeRF.

density(x) = sum_i o_i exp(-1/2 (x - mu_i)^T Sigma_i^-1 (x - mu_i)), Sigma_i = R_i diag(s_i^2) R_i^T:
each Gaussian's opacity spread by its kernel (what DreamGaussian meshes). color(x) is the
density-weighted mean of the Gaussians' colors there. Queries come in compact blocks of points
(``grid.sample_grid``), and each block only sees the Gaussians whose ``cutoff_sigma`` box overlaps it
(the blockwise evaluation DreamGaussian uses), evaluated in slices of Gaussians to bound memory.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.tensors import GaussianTensors
from lift3d.rotations import quaternion_to_matrix


def gaussian_bbox(gaussians: GaussianTensors, cutoff_sigma: float = 3.0) -> np.ndarray:
    """The box [2, 3] holding every Gaussian out to ``cutoff_sigma`` standard deviations."""
    g = gaussians.detached()
    extent = _extents(g, cutoff_sigma)
    lo = (g.means - extent).min(dim=0).values
    hi = (g.means + extent).max(dim=0).values
    return torch.stack([lo, hi]).cpu().double().numpy()


def gaussian_mesh_box(gaussians: GaussianTensors, cutoff_sigma: float = 3.0, margin: float = 0.25) -> np.ndarray:
    """The box [2, 3] to mesh Gaussians in: ``gaussian_bbox`` clipped to where the content is (the 2-98 percentile box
    of the centers, ``lift3d.framing.content_box``) grown by ``margin`` of its size on every side. An object keeps its
    whole box; a scene's far background, which would stretch the grid and leave the object a few voxels wide, is cut."""
    from lift3d.framing import content_box

    full = gaussian_bbox(gaussians, cutoff_sigma)
    low, high = (t.double().numpy() for t in content_box(gaussians.means))
    grow = margin * np.maximum(high - low, 1e-3)
    box = np.stack([np.maximum(full[0], low - grow), np.minimum(full[1], high + grow)])
    return box if (box[1] > box[0]).all() else full


def reaching(gaussians: GaussianTensors, box: np.ndarray, cutoff_sigma: float = 3.0) -> Tensor:
    """[N] bool: the Gaussians whose ``cutoff_sigma`` box overlaps ``box`` [2, 3] (the only ones with density there)."""
    g = gaussians.detached()
    extent = _extents(g, cutoff_sigma)
    low, high = (torch.as_tensor(b, dtype=g.means.dtype, device=g.means.device) for b in box)
    return ((g.means + extent >= low) & (g.means - extent <= high)).all(dim=1)


def _extents(g: GaussianTensors, cutoff_sigma: float) -> Tensor:
    """Half-widths [N, 3] of the axis-aligned boxes around each Gaussian out to ``cutoff_sigma``."""
    rot = quaternion_to_matrix(g.quats)
    # the standard deviation along world axis k is sqrt(sum_j R_kj^2 s_j^2)
    return cutoff_sigma * torch.sqrt(((rot * g.scales[:, None, :]) ** 2).sum(-1))


class GaussianField:
    """Density and color of a Gaussian set at any query points, each point meeting only the Gaussians
    that can reach it.

    DreamGaussian evaluates the grid block by block against the Gaussians overlapping each block; here
    the blocks are the cells of a sparse hash grid sized to the Gaussians (``cell_size``: a quarter of
    the median width of their cutoff boxes unless given, coarsened while the table would exceed
    ``max_entries``), built once: a point is paired with the Gaussians whose
    ``cutoff_sigma`` box overlaps its cell, and the pairs are evaluated in slices of ``max_pairs``. The
    result equals the sum over all Gaussians, each cut off at ``cutoff_sigma`` standard deviations.
    """

    # the density is an opacity-weighted kernel sum, unitless (not per unit length as a NeRF's): a grid
    # sample's opacity is 1 - exp(-density * opacity_scale) whatever the voxel size (automatic iso-levels)
    opacity_scale = 1.0

    def __init__(self, gaussians: GaussianTensors, cutoff_sigma: float = 3.0, max_pairs: int = 2**22,
                 cell_size: float | None = None, max_entries: int = 2**25) -> None:
        g = gaussians.detached()
        self.gaussians = g
        self.cutoff_sigma = cutoff_sigma
        self.max_pairs = max_pairs  # (point, Gaussian) pairs evaluated at once
        rot = quaternion_to_matrix(g.quats)
        # whitening: d = diag(1/s) R^T (x - mu), so the exponent is -|d|^2 / 2
        self._whiten = rot.transpose(1, 2) / g.scales.clamp_min(1e-12)[:, :, None]
        extent = _extents(g, cutoff_sigma)
        lo, hi = g.means - extent, g.means + extent
        self._origin = lo.min(dim=0).values
        span = float((hi.max(dim=0).values - self._origin).max())
        cell = float(cell_size) if cell_size else 0.25 * float((2 * extent).max(dim=1).values.median())
        cell = max(cell, span / 1024, 1e-12)
        while True:  # coarser cells until the (cell, Gaussian) table fits
            self._cell = cell
            self._dims = torch.clamp(((hi.max(dim=0).values - self._origin) / cell).floor().long() + 1, min=1)
            cell_lo, cell_hi = self._cell_index(lo), self._cell_index(hi)
            counts = (cell_hi - cell_lo + 1).prod(dim=1)
            if int(counts.sum()) <= max_entries:
                break
            cell *= 2.0
        owner = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
        local = torch.arange(int(counts.sum()), device=counts.device) - (torch.cumsum(counts, 0) - counts)[owner]
        size = cell_hi - cell_lo + 1
        ix = cell_lo[owner, 0] + local % size[owner, 0]
        iy = cell_lo[owner, 1] + (local // size[owner, 0]) % size[owner, 1]
        iz = cell_lo[owner, 2] + local // (size[owner, 0] * size[owner, 1])
        keys = self._linear(torch.stack([ix, iy, iz], dim=1))
        order = torch.argsort(keys)
        self._table = owner[order]  # Gaussian ids grouped by cell
        self._cells, cell_counts = torch.unique_consecutive(keys[order], return_counts=True)
        self._cell_counts = cell_counts
        self._cell_starts = torch.cumsum(cell_counts, 0) - cell_counts
        self._tree = None  # k-d tree of the centers, built on first need

    def _cell_index(self, points: Tensor) -> Tensor:
        idx = ((points - self._origin) / self._cell).floor().long()
        return torch.minimum(idx.clamp_min(0), self._dims - 1)

    def _linear(self, idx: Tensor) -> Tensor:
        return idx[:, 0] + self._dims[0] * (idx[:, 1] + self._dims[1] * idx[:, 2])

    def to(self, device: torch.device | str) -> GaussianField:
        """This field on ``device`` (itself when already there)."""
        g = self.gaussians
        if g.means.device == torch.device(device):
            return self
        tensors = (g.means, g.scales, g.quats, g.opacities, g.colors)
        moved = GaussianTensors(*(None if t is None else t.to(device) for t in tensors))
        return GaussianField(moved, self.cutoff_sigma, self.max_pairs, self._cell)

    def _accumulate(self, points: Tensor, with_color: bool) -> tuple[Tensor, Tensor | None]:
        g = self.gaussians
        points = points.to(g.means)
        n = points.shape[0]
        density = torch.zeros(n, dtype=points.dtype, device=points.device)
        color = torch.zeros(n, 3, dtype=points.dtype, device=points.device) if with_color else None
        if n == 0:
            return density, color
        keys = self._linear(self._cell_index(points))
        pos = torch.searchsorted(self._cells, keys).clamp_max(len(self._cells) - 1)
        inside = ((points >= self._origin) & (points <= self._origin + self._dims * self._cell)).all(dim=1)
        found = (self._cells[pos] == keys) & inside
        counts = torch.where(found, self._cell_counts[pos], torch.zeros_like(keys))
        starts = self._cell_starts[pos]
        ends = torch.cumsum(counts, 0)
        cutoff2 = self.cutoff_sigma**2
        first = 0
        while first < n:  # slices of points whose pairs fit in max_pairs
            base = int(ends[first - 1]) if first else 0
            last = int(torch.searchsorted(ends, torch.tensor(base + self.max_pairs, device=ends.device), right=True))
            last = min(max(last, first + 1), n)
            c = counts[first:last]
            total = int(c.sum())
            if total:
                owner = torch.repeat_interleave(torch.arange(first, last, device=c.device), c)
                local = torch.arange(total, device=c.device) - (torch.cumsum(c, 0) - c)[owner - first]
                gid = self._table[starts[owner] + local]
                d = torch.einsum("pij,pj->pi", self._whiten[gid], points[owner] - g.means[gid])
                m2 = (d * d).sum(-1)
                w = torch.where(m2 <= cutoff2, g.opacities[gid] * torch.exp(-0.5 * m2), torch.zeros_like(m2))
                density.index_add_(0, owner, w)
                if color is not None:
                    color.index_add_(0, owner, w[:, None] * g.colors[gid])
            first = last
        return density, color

    @torch.no_grad()
    def density(self, points: Tensor) -> Tensor:
        """Opacity-weighted kernel sum [M] at ``points`` [M, 3] (0 beyond ``cutoff_sigma`` of every Gaussian)."""
        return self._accumulate(points, with_color=False)[0]

    @torch.no_grad()
    def color(self, points: Tensor) -> Tensor:
        """Density-weighted mean color [M, 3] at ``points`` [M, 3]; where no Gaussian reaches, the color
        of the Gaussian with the nearest center."""
        if self.gaussians.colors is None:
            raise ValueError("these Gaussians have no colors: pass GaussianTensors(colors=[N, 3] RGB) to query colors")
        density, color = self._accumulate(points, with_color=True)
        out = color / density.clamp_min(1e-12)[:, None]
        empty = density <= 1e-12
        if bool(empty.any()):
            out[empty] = self._nearest_color(points[empty].to(out))
        return out.clamp(0.0, 1.0)

    def _nearest_color(self, points: Tensor) -> Tensor:
        from scipy.spatial import cKDTree

        if self._tree is None:
            self._tree = cKDTree(self.gaussians.means.cpu().numpy())
        _, index = self._tree.query(points.cpu().numpy())
        return self.gaussians.colors[torch.as_tensor(index, device=self.gaussians.means.device)].to(points)

