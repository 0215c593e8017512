"""TSDF fusion of rendered depth maps and its mesh: pure functions on tensors and arrays.

A voxel grid holds, at each voxel, the mean of the truncated signed distances ``clamp(s / tau, max=1)`` that the views
observe there: ``s`` is the distance along the voxel's ray to the surface point its pixel shows (at the rendered depth;
positive in front of it), measured in the grid's space, ``tau`` the truncation; views in which the voxel lies more
than ``tau`` behind the surface skip it.
Pixels less opaque than ``min_alpha`` show nothing along their ray: their voxels are observed empty (space carving),
except next to a silhouette, where a pixel's center may miss what covers part of it.
The grid covers a box (``bounded``), or all of space squeezed into a ball around one (``contracted``, Mip-NeRF 360's
contraction, for unbounded captures: voxels grow with distance, and distances are measured between contracted points).

Voxels no view observes are unknown: with ``fill_holes`` an unknown region that does not reach the grid's border and
borders on more voxels behind surfaces than in front of them is solid (an object's inside, pockets no view reaches),
the others empty; the mesh never has faces in cells that touch an empty unknown voxel (without ``fill_holes``: any
unknown voxel), so unseen space leaves openings, not walls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import mcubes
import numpy as np
import torch
from scipy import ndimage
from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.config import bounded, choice
from lift3d.export.grid import as_bbox, grid_axes
from lift3d.export.mesh import submesh
from lift3d.fields.contraction import contract, uncontract
from lift3d.meshes.mesh import Mesh

SPACES = ("bounded", "contracted")
DEPTHS = ("median", "expected")
VIEWS = ("auto", "train", "sphere")


@dataclass
class TSDFConfig:
    """How a mesh is fused from rendered depths (``system.export.tsdf``, used when ``export.mesh_method`` is tsdf)."""

    # the rendered depth fused: median (2DGS's choice for objects) or expected (the only one 3DGS renders)
    depth: str = choice(*DEPTHS)
    # signed distances are truncated at this many voxels (and voxels further behind are not updated)
    truncation: float = bounded(4.0, above=0)
    # auto (the run's training views when it kept them, else a sphere around the content), train or sphere
    views: str = choice(*VIEWS)
    # views on the sphere around the content (views=sphere, or auto without training views)
    sphere_views: int = bounded(60, low=1)
    image_size: int = bounded(0, low=0)  # sphere views: side in pixels (0: twice export.resolution)
    # bounded (the content's box) or contracted (all of space in a ball around it: unbounded captures)
    space: str = choice(*SPACES)
    min_alpha: float = bounded(0.5, low=0, high=1)  # pixels less opaque than this show no surface: their rays carve empty space
    max_depth: float = bounded(0.0, low=0)  # rendered depths beyond this count as no surface (0: no limit; unbounded captures)


@dataclass
class VoxelGrid:
    """Voxel centers on ``axes`` (x, y, z samples of the grid's own space): the world box itself (bounded) or the
    contracted ball [-2, 2]^3 around ``center`` in units of ``half`` (contracted)."""

    axes: list[np.ndarray]
    space: str = "bounded"
    center: np.ndarray | None = None  # [3] contracted: the world point at the grid's center
    half: np.ndarray | None = None  # [3] contracted: the world size of one unit of the grid's space

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(len(a) for a in self.axes)  # type: ignore[return-value]

    @property
    def step(self) -> np.ndarray:
        return np.array([a[1] - a[0] for a in self.axes])

    def grid_points(self, index: Tensor) -> Tensor:
        """Grid-space positions [N, 3] of (fractional) voxel indices [N, 3]."""
        origin = index.new_tensor([a[0] for a in self.axes])
        return origin + index * index.new_tensor(self.step)

    def to_world(self, points: Tensor) -> Tensor:
        """World positions [N, 3] of grid-space positions [N, 3]."""
        if self.space == "bounded":
            return points
        return points.new_tensor(self.center) + uncontract(points, "sphere") * points.new_tensor(self.half)

    def to_grid(self, points: Tensor) -> Tensor:
        """Grid-space positions [..., 3] of world positions [..., 3] (the inverse of ``to_world``)."""
        if self.space == "bounded":
            return points
        return contract((points - points.new_tensor(self.center)) / points.new_tensor(self.half), "sphere")

    def inside(self, points: Tensor) -> Tensor:
        """[N] bool: grid-space positions that stand for world points (the contracted ball's; all of a box)."""
        if self.space == "bounded":
            return torch.ones_like(points[:, 0], dtype=torch.bool)
        return points.norm(dim=-1) < 2.0 - 1e-3


def bounded_grid(box: np.ndarray, resolution: int) -> VoxelGrid:
    """``resolution`` voxels along the longest side of the world box [2, 3]."""
    return VoxelGrid(grid_axes(box, resolution))


def contracted_grid(box: np.ndarray, resolution: int) -> VoxelGrid:
    """``resolution`` voxels across the contracted ball of all space, whose inner half is the world box [2, 3]."""
    box = as_bbox(box)
    axes = [np.linspace(-2.0, 2.0, resolution) for _ in range(3)]
    return VoxelGrid(axes, "contracted", (box[0] + box[1]) / 2, (box[1] - box[0]) / 2)


@dataclass
class FusedVolume:
    """The fused grid: mean truncated signed distance (positive in front of surfaces) and observation weight."""

    grid: VoxelGrid
    tsdf: Tensor  # [X, Y, Z] in [-1, 1] where observed
    weight: Tensor  # [X, Y, Z] the summed weights of the views that observed each voxel (0: unknown)


def incidence(cameras: Cameras, depth: Tensor, solid: Tensor) -> Tensor:
    """[B, H, W] |cos| of the angle between each pixel's ray and the normal of the depth map [B, H, W] there (central
    differences of its points); 0 where a pixel or one of its 8 neighbors is not ``solid`` [B, H, W] (a silhouette)."""
    origins, directions = cameras.rays(normalized=False)
    points = origins.to(depth) + depth[..., None] * directions.to(depth)
    down = points[:, 2:, 1:-1] - points[:, :-2, 1:-1]
    across = points[:, 1:-1, 2:] - points[:, 1:-1, :-2]
    normal = torch.nn.functional.normalize(torch.linalg.cross(down, across, dim=-1), dim=-1)
    ray = torch.nn.functional.normalize(directions[:, 1:-1, 1:-1].to(depth), dim=-1)
    cos = torch.nn.functional.pad((normal * ray).sum(-1).abs(), (1, 1, 1, 1))
    interior = -torch.nn.functional.max_pool2d(-solid.float()[:, None], 3, stride=1, padding=1)[:, 0] > 0.5
    return torch.where(interior, cos, torch.zeros_like(cos))


@torch.no_grad()
def fuse_depths(grid: VoxelGrid, frames: Iterable[tuple[Cameras, Tensor, Tensor]], truncation: float = 4.0,
                min_alpha: float = 0.5, max_depth: float = 0.0, chunk: int = 1 << 22,
                device: torch.device | str = "cpu", min_cos: float = 0.2, voxels: Tensor | None = None) -> FusedVolume:
    """Fuse ``frames`` (cameras [B], z-depth [B, H, W], opacity [B, H, W]) into ``grid``. A voxel's signed distance in
    a view is its distance in grid space to the surface point its pixel shows on its ray (positive in front), truncated
    at ``truncation`` voxels, weighted by the cosine of the angle at which the view sees that surface (views more
    grazing than ``min_cos``, and pixels on silhouettes, do not count). Depths beyond ``max_depth`` (> 0) count as no
    surface, and only the voxels in front of it are observed empty. ``voxels``: the flat indices to fuse (the others
    stay unknown; None: all)."""
    shape = grid.shape
    total = shape[0] * shape[1] * shape[2]
    voxels = torch.arange(total, device=device) if voxels is None else voxels.to(device)
    tau = truncation * float(grid.step.max())
    tsdf_sum = torch.zeros(total, device=device)
    weight = torch.zeros(total, device=device)
    for cameras, depth, alpha in frames:
        cameras = cameras.to(device)
        depth, alpha = depth.to(device).float(), alpha.to(device).float()
        w2c, K, origin = cameras.w2c_opencv().float(), cameras.intrinsics.float(), cameras.positions.float()
        B, H, W = depth.shape
        solid = (alpha >= min_alpha) & (depth > 0)
        near_solid = torch.nn.functional.max_pool2d(solid.float()[:, None], 3, stride=1, padding=1)[:, 0] > 0
        cos = incidence(cameras, depth, solid)
        flat_depth, flat_alpha, flat_cos = depth.reshape(B, -1), alpha.reshape(B, -1), cos.reshape(B, -1)
        flat_clear = (~near_solid).reshape(B, -1)
        step = max(1, chunk // B)
        for start in range(0, len(voxels), step):
            ids = voxels[start : start + step]
            index = torch.stack([ids // (shape[1] * shape[2]), (ids // shape[2]) % shape[1], ids % shape[2]], dim=-1)
            local = grid.grid_points(index.float())  # [n, 3]
            points = grid.to_world(local)
            cam = torch.einsum("bij,nj->bni", w2c[:, :3, :3], points) + w2c[:, None, :3, 3]  # [B, n, 3]
            z = cam[..., 2]
            safe = torch.where(z > 1e-6, z, torch.ones_like(z))
            col = torch.floor(K[:, None, 0, 0] * cam[..., 0] / safe + K[:, None, 0, 2]).long()
            row = torch.floor(K[:, None, 1, 1] * cam[..., 1] / safe + K[:, None, 1, 2]).long()
            inside = (z > 1e-6) & (col >= 0) & (col < W) & (row >= 0) & (row < H) & grid.inside(local)
            pixel = row.clamp(0, H - 1) * W + col.clamp(0, W - 1)
            d, a, c = flat_depth.gather(1, pixel), flat_alpha.gather(1, pixel), flat_cos.gather(1, pixel)
            surface = (a >= min_alpha) & (d > 0)
            inside &= torch.where(surface, c >= min_cos, flat_clear.gather(1, pixel))  # silhouettes tell nothing
            if max_depth > 0:
                inside &= surface | (z <= max_depth)
                surface &= d <= max_depth
            # the surface point on the voxel's ray, and its distance from the voxel in grid space
            seen = origin[:, None] + (d / safe)[..., None] * (points[None] - origin[:, None])  # [B, n, 3]
            gap = (grid.to_grid(seen) - local[None]).norm(dim=-1)
            sdf = torch.where(surface, torch.where(d >= z, gap, -gap), torch.full_like(z, float("inf")))
            w = torch.where(inside & (sdf >= -tau), torch.where(surface, c, torch.ones_like(c)), torch.zeros_like(c))
            tsdf_sum[ids] += (w * (sdf / tau).clamp(max=1.0).nan_to_num(0.0)).sum(0)
            weight[ids] += w.sum(0)
    tsdf = torch.where(weight > 0, tsdf_sum / weight.clamp_min(1e-12), torch.ones_like(tsdf_sum))
    return FusedVolume(grid, tsdf.reshape(shape), weight.reshape(shape))


@torch.no_grad()
def fuse_narrow_band(grid: VoxelGrid, frames: Sequence[tuple[Cameras, Tensor, Tensor]], truncation: float = 4.0,
                     coarse: int = 4, device: torch.device | str = "cpu", **options) -> FusedVolume:
    """``fuse_depths`` of a fine grid computed near surfaces only: a grid ``coarse`` times coarser (truncation two of its
    voxels) finds them; fine voxels within one coarse voxel of where it is not observed empty are fused, the others
    take its state (observed empty, or unknown). Grids under 64 voxels a side are fused whole."""
    if min(grid.shape) < 16 * coarse:
        return fuse_depths(grid, frames, truncation, device=device, **options)
    rough_grid = VoxelGrid([a[::coarse] for a in grid.axes], grid.space, grid.center, grid.half)
    rough = fuse_depths(rough_grid, frames, 2.0, device=device, **options)
    near = ((rough.weight > 0) & (rough.tsdf < 1)).float()[None, None]
    near = torch.nn.functional.max_pool3d(near, 3, stride=1, padding=1)[0, 0] > 0
    index = [torch.clamp(torch.round(torch.arange(n, device=device) / coarse).long(), max=m - 1)
             for n, m in zip(grid.shape, rough_grid.shape)]
    nearest = torch.meshgrid(*index, indexing="ij")  # each fine voxel's nearest coarse voxel
    active = near[nearest].reshape(-1)
    fine = fuse_depths(grid, frames, truncation, device=device, voxels=torch.nonzero(active)[:, 0], **options)
    seen_empty = (~active & (rough.weight[nearest].reshape(-1) > 0)).reshape(grid.shape)
    weight = torch.where(seen_empty, torch.ones_like(fine.weight), fine.weight)
    return FusedVolume(grid, torch.where(seen_empty, torch.ones_like(fine.tsdf), fine.tsdf), weight)


def enclosed_inside(unknown: np.ndarray, tsdf: np.ndarray) -> np.ndarray:
    """[X, Y, Z] bool: the unknown voxels that lie inside surfaces: their 6-connected unknown region does not reach
    the grid's border and, of the observed voxels next to it, more lie behind a surface (negative) than in front."""
    labels, count = ndimage.label(unknown)
    if count == 0:
        return np.zeros_like(unknown)
    outer = np.zeros(count + 1, dtype=bool)
    for axis in range(3):
        for end in (0, -1):
            outer[np.take(labels, end, axis=axis)] = True
    behind, front = np.zeros(count + 1), np.zeros(count + 1)
    observed = ~unknown
    for axis in range(3):
        for shift in (1, -1):
            neighbor = np.roll(observed, shift, axis=axis)
            value = np.roll(tsdf, shift, axis=axis)
            edge = [slice(None)] * 3
            edge[axis] = 0 if shift == 1 else -1  # np.roll wraps around: the wrapped layer is no neighbor
            neighbor[tuple(edge)] = False
            touch = unknown & neighbor
            behind += np.bincount(labels[touch & (value < 0)], minlength=count + 1)
            front += np.bincount(labels[touch & (value >= 0)], minlength=count + 1)
    solid = ~outer & (behind > front)
    solid[0] = False
    return solid[labels]


def solid_and_masked(volume: FusedVolume, fill_holes: bool) -> tuple[np.ndarray, np.ndarray]:
    """(occupancy values [X, Y, Z], positive inside, level 0; cells to leave out [X, Y, Z] bool, per voxel): observed
    voxels give -tsdf; unknown ones are solid (+1) when ``fill_holes`` and ``enclosed_inside``, else empty (-1) and
    masked."""
    tsdf = volume.tsdf.cpu().numpy().astype(np.float32)
    values = -tsdf
    unknown = volume.weight.cpu().numpy() <= 0
    masked = unknown.copy()
    if fill_holes and unknown.any():
        enclosed = enclosed_inside(unknown, tsdf)
        values[enclosed] = 1.0
        masked &= ~enclosed
    values[masked] = -1.0
    return values, masked


def tsdf_mesh(volume: FusedVolume, fill_holes: bool = True) -> Mesh:
    """The zero level of the fused distances as a Mesh in world coordinates (faces outward), no face in a cell that
    touches a masked voxel (``solid_and_masked``); surfaces cut by the grid's border are closed there."""
    values, masked = solid_and_masked(volume, fill_holes)
    values = np.pad(values, 1, constant_values=-1.0)  # empty beyond the border: cut surfaces close on it
    masked = np.pad(masked, 1, constant_values=False)
    if not (values > 0).any():
        return Mesh(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64))
    vertices, faces = mcubes.marching_cubes(values, 0.0)
    faces = faces.astype(np.int64)
    if len(faces):
        cell = np.floor(vertices[faces].mean(axis=1)).astype(np.int64)  # each face lies inside one cell
        cell = np.clip(cell, 0, np.array(values.shape) - 2)
        bad = np.zeros(len(faces), dtype=bool)
        for corner in np.ndindex(2, 2, 2):
            c = cell + np.array(corner)
            bad |= masked[c[:, 0], c[:, 1], c[:, 2]]
        faces = faces[~bad]
    grid_space = volume.grid.grid_points(torch.as_tensor(vertices - 1.0, dtype=torch.float64))
    world = volume.grid.to_world(grid_space).numpy()
    return submesh(Mesh(world.astype(np.float32), faces), np.ones(len(faces), dtype=bool))  # used vertices only
