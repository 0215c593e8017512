"""Sampling a scalar field on a regular grid, in spatially compact blocks, and choosing its iso-level.

A field here is any ``fn(points [N, 3]) -> [N]`` on torch tensors (a NeRF's activated density, a
Gaussian set's density); colors are ``fn(points [N, 3]) -> [N, 3]`` in 0..1. Blocks are small cubes
of the grid, so a field that culls by region (the Gaussian density does) touches only what is near.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from lift3d.progress import Stage

log = logging.getLogger(__name__)

DensityFn = Callable[[Tensor], Tensor]  # points [N, 3] -> density [N]
ColorFn = Callable[[Tensor], Tensor]  # points [N, 3] -> RGB [N, 3] in 0..1
BboxLike = Tensor | np.ndarray | Sequence[Sequence[float]]  # [2, 3]: min corner, max corner


def as_bbox(bbox: BboxLike) -> np.ndarray:
    """A box [2, 3] float64 (min corner, max corner); errors name what is wrong with it."""
    box = bbox.detach().cpu().double().numpy() if isinstance(bbox, Tensor) else np.asarray(bbox, dtype=np.float64)
    if box.shape == (6,):
        box = box.reshape(2, 3)
    if box.shape != (2, 3):
        raise ValueError(f"a bounding box must be [2, 3] (min corner, max corner), got shape {box.shape}")
    if not np.isfinite(box).all() or not (box[1] > box[0]).all():
        raise ValueError(f"a bounding box needs finite corners with max > min on every axis, got {box.tolist()}")
    return box


def grid_axes(bbox: BboxLike, resolution: int) -> list[np.ndarray]:
    """Sample positions along x, y, z: ``resolution`` samples across the longest side, the same
    spacing (to within rounding) on the others, so voxels are (nearly) cubes. Corners are sampled."""
    if resolution < 2:
        raise ValueError(f"the grid resolution must be at least 2 samples per side, got {resolution}")
    box = as_bbox(bbox)
    extent = box[1] - box[0]
    voxel = extent.max() / (resolution - 1)
    counts = [max(2, int(round(e / voxel)) + 1) for e in extent]
    return [np.linspace(box[0, a], box[1, a], counts[a]) for a in range(3)]


def voxel_size(axes: list[np.ndarray]) -> np.ndarray:
    """Spacing [3] of a grid given by its axes."""
    return np.array([a[1] - a[0] for a in axes])


def level_crop(volume: np.ndarray, threshold: float, pad: int = 1) -> tuple[slice, slice, slice] | None:
    """The index box of the samples of ``volume`` at or above ``threshold``, grown by ``pad`` samples and clipped
    to the grid (None when there are none): outside it every sample is below the level, so no surface lies there
    and all its empty space reaches the grid's border. Meshing steps work on this box instead of the whole grid."""
    above = volume >= threshold
    box = []
    for axis in range(3):
        used = np.flatnonzero(above.any(axis=tuple(a for a in range(3) if a != axis)))
        if len(used) == 0:
            return None
        box.append(slice(max(int(used[0]) - pad, 0), min(int(used[-1]) + 1 + pad, volume.shape[axis])))
    return box[0], box[1], box[2]


def block_side(chunk: int) -> int:
    """Side of the cube blocks that hold at most ``chunk`` points."""
    if chunk < 8:
        raise ValueError(f"chunk must be at least 8 points, got {chunk}")
    return max(2, int(math.floor(chunk ** (1.0 / 3.0) + 1e-9)))


@torch.no_grad()
def sample_grid(fn: DensityFn, axes: list[np.ndarray], chunk: int = 2**18, device: torch.device | str = "cpu") -> np.ndarray:
    """``fn`` at every grid point -> float32 [X, Y, Z] (axis 0 is x), queried in cube blocks of at
    most ``chunk`` points, each a compact region of space."""
    shape = tuple(len(a) for a in axes)
    out = np.empty(shape, dtype=np.float32)
    side = block_side(chunk)
    torch_axes = [torch.as_tensor(a, dtype=torch.float32, device=device) for a in axes]
    blocks = math.prod(math.ceil(n / side) for n in shape)
    with Stage(f"meshing: density on a {' x '.join(map(str, shape))} grid", blocks, "blocks") as stage:
        _sample_blocks(fn, torch_axes, out, side, stage)
    if not np.isfinite(out).all():
        raise ValueError(f"the density has {int((~np.isfinite(out)).sum())} non-finite values on the grid; check the field")
    return out


def _sample_blocks(fn: DensityFn, torch_axes: list[Tensor], out: np.ndarray, side: int, stage: Stage) -> None:
    """Fill ``out`` [X, Y, Z] with ``fn`` at the grid of ``torch_axes``, one cube block of ``side`` at a time."""
    shape = out.shape
    for x0 in range(0, shape[0], side):
        for y0 in range(0, shape[1], side):
            for z0 in range(0, shape[2], side):
                xs, ys, zs = (t[s : s + side] for t, s in zip(torch_axes, (x0, y0, z0)))
                points = torch.stack(torch.meshgrid(xs, ys, zs, indexing="ij"), dim=-1).reshape(-1, 3)
                values = fn(points)
                if values.shape not in ((points.shape[0],), (points.shape[0], 1)):
                    raise ValueError(f"the density function returned shape {tuple(values.shape)} for {points.shape[0]} "
                                     "points; it must return [N]")
                block = values.reshape(len(xs), len(ys), len(zs)).float().cpu().numpy()
                out[x0 : x0 + len(xs), y0 : y0 + len(ys), z0 : z0 + len(zs)] = block
                stage.advance()


@torch.no_grad()
def query_points(fn: ColorFn, points: np.ndarray, chunk: int = 2**18, device: torch.device | str = "cpu",
                 what: str = "colors") -> np.ndarray:
    """``fn`` at ``points`` [N, 3] in chunks -> float32 [N, C] (e.g. colors); ``what`` names the step in progress lines."""
    outputs = []
    with Stage(f"{what} at {len(points)} points", math.ceil(len(points) / chunk), "chunks") as stage:
        for start in range(0, len(points), chunk):
            batch = torch.as_tensor(points[start : start + chunk], dtype=torch.float32, device=device)
            outputs.append(fn(batch).float().cpu().numpy())
            stage.advance()
    if not outputs:
        return np.zeros((0, 3), np.float32)
    return np.concatenate(outputs).astype(np.float32)


def otsu_level(values: np.ndarray, bins: int = 256) -> float:
    """Otsu's threshold of ``values`` in [0, 1]: the cut that maximizes the between-class variance."""
    hist, edges = np.histogram(values, bins=bins, range=(0.0, 1.0))
    p = hist.astype(np.float64) / max(hist.sum(), 1)
    centers = 0.5 * (edges[:-1] + edges[1:])
    w0 = np.cumsum(p)  # weight of the class below each cut (cut after bin i)
    m0 = np.cumsum(p * centers)
    total = m0[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        between = (total * w0 - m0) ** 2 / (w0 * (1.0 - w0))
    between[~np.isfinite(between)] = -1.0
    return float(edges[int(np.argmax(between)) + 1])


def auto_threshold(density: np.ndarray, opacity_scale: float) -> float:
    """The iso-level of a density grid, found where the grid separates best into empty and solid.

    Each sample becomes the opacity of a slab of thickness ``opacity_scale`` (for a NeRF, the voxel
    size): ``a = 1 - exp(-density * opacity_scale)``, which lies in [0, 1] whatever the density's
    scale, so a few huge values do not dominate. Otsu's method on these opacities splits empty
    space from solid: at its optimum the cut is the midpoint of the two classes' means, so for a
    clean field the surface lands where a voxel is about half opaque. Returns the density level.
    """
    density = np.asarray(density, dtype=np.float64)
    alpha = -np.expm1(-np.clip(density, 0.0, None) * opacity_scale)
    if alpha.max() < 1e-3:
        raise ValueError(
            f"the field is empty on the grid (max density {density.max():.3g}, so every voxel is under 0.1% opaque): "
            "nothing to mesh. Check the bounding box, or pass an explicit threshold."
        )
    level = otsu_level(alpha)
    if not 0.0 < level < 1.0:
        level = 0.5 * float(alpha.max())
    return float(-np.log1p(-min(level, 1.0 - 1e-7)) / opacity_scale)


def tighten_bbox(bbox: BboxLike, occupancy: Tensor | np.ndarray, pad_cells: int = 1) -> np.ndarray:
    """The part of ``bbox`` covered by occupied cells of ``occupancy`` [Rx, Ry, Rz] (cells tile the box),
    grown by ``pad_cells`` cells on each side and clipped to the box. An empty grid keeps the box."""
    box = as_bbox(bbox)
    occ = occupancy.detach().cpu().numpy() if isinstance(occupancy, Tensor) else np.asarray(occupancy)
    if occ.ndim != 3:
        raise ValueError(f"the occupancy grid must be [Rx, Ry, Rz], got shape {occ.shape}")
    occ = occ.astype(bool)
    if not occ.any():
        log.warning("the occupancy grid is empty; meshing the whole bounding box")
        return box
    cell = (box[1] - box[0]) / np.array(occ.shape)
    lo, hi = np.zeros(3), np.zeros(3)
    for axis in range(3):
        others = tuple(a for a in range(3) if a != axis)
        used = np.nonzero(occ.any(axis=others))[0]
        lo[axis] = box[0, axis] + max(used[0] - pad_cells, 0) * cell[axis]
        hi[axis] = box[0, axis] + min(used[-1] + 1 + pad_cells, occ.shape[axis]) * cell[axis]
    return np.stack([lo, hi])


def sample_box(fn: DensityFn, bbox: BboxLike, resolution: int, chunk: int = 2**18, occupancy: Tensor | np.ndarray | None = None,
               device: torch.device | str | None = None) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """(``fn`` on a grid of ``resolution`` samples along the longest side of ``bbox``, its axes, the box): the box
    shrunk to the cells ``occupancy`` marks first, when given; queries on ``device`` (None: ``bbox``'s device when it
    is a tensor, else the CPU). What meshing and turntable framing sample a field on."""
    box = as_bbox(bbox)
    if device is None:
        device = bbox.device if isinstance(bbox, torch.Tensor) else "cpu"
    if occupancy is not None:
        box = tighten_bbox(box, occupancy)
    axes = grid_axes(box, resolution)
    return sample_grid(fn, axes, chunk=chunk, device=device), axes, box
