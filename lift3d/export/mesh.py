"""Triangle meshes from density fields: grid sampling, marching cubes, clean-up, decimation, colors.

Marching cubes is PyMCubes: a small compiled wheel with only numpy as a dependency (scikit-image
would add a large stack for the same surface), fast, and its vertices come out welded (shared
between triangles) and wound counter-clockwise seen from the low-density side, i.e. outward.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import mcubes
import numpy as np
import torch
from scipy import ndimage
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from lift3d.export.grid import (
    BboxLike,
    ColorFn,
    DensityFn,
    auto_threshold,
    level_crop,
    query_points,
    sample_box,
    voxel_size,
)
from lift3d.meshes.mesh import Mesh
from lift3d.progress import Stage

log = logging.getLogger(__name__)


def marching_cubes(volume: np.ndarray, threshold: float, axes: list[np.ndarray], close_boundary: bool = True) -> Mesh:
    """The ``threshold`` iso-surface of ``volume`` [X, Y, Z] sampled at ``axes``, enclosing values above it.

    With ``close_boundary`` the field counts as empty just outside the grid, so surfaces cut by the
    box are closed there (on the box's faces, to which vertices are clipped). Only the index box of ``level_crop``
    is meshed: outside it no cell crosses the level."""
    crop = level_crop(volume, threshold)
    if crop is None:
        return Mesh(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64))
    offset = np.array([s.start for s in crop])
    volume = volume[crop]
    pad = 1 if close_boundary else 0
    if pad:
        floor = min(float(volume.min()), threshold) - 1.0
        volume = np.pad(volume, 1, mode="constant", constant_values=floor)
    vertices, faces = mcubes.marching_cubes(volume, float(threshold))
    vertices = vertices + (offset - pad)
    step = voxel_size(axes)
    origin = np.array([a[0] for a in axes])
    world = origin + vertices * step
    if pad:
        world = np.clip(world, origin, np.array([a[-1] for a in axes]))
    return Mesh(world.astype(np.float32), faces.astype(np.int64))


def remove_degenerate(mesh: Mesh, tolerance: float) -> Mesh:
    """Vertices closer than ``tolerance`` welded and zero-area faces dropped (marching cubes makes them
    where the surface passes through a grid point; UV unwrapping cannot place them)."""
    if len(mesh.faces) == 0:
        return mesh
    keys = np.round(mesh.vertices.astype(np.float64) / tolerance).astype(np.int64)
    first, inverse = unique_rows(keys)
    faces = inverse[mesh.faces]
    tri = mesh.vertices[first][faces].astype(np.float64)
    area2 = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    keep = (faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 2] != faces[:, 0]) & (area2 > tolerance**2)
    return submesh(on_vertices(mesh, first, faces), keep)


def unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, axis=0, return_index=True, return_inverse=True)[1:]`` for int rows [N, C] by one stable lexsort
    (rows in lexicographic order, each group's first index), without numpy's slower row-as-record path."""
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    starts = np.ones(len(keys), dtype=bool)
    starts[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    inverse = np.empty(len(keys), dtype=np.int64)
    inverse[order] = np.cumsum(starts) - 1
    return order[starts], inverse


def fill_cavities(volume: np.ndarray, threshold: float) -> np.ndarray:
    """``volume`` with enclosed empty pockets raised above ``threshold``, so a shell meshes as one
    outer surface (no inner wall) — e.g. Gaussians that cover only an object's skin. Pockets are the empty
    6-connected regions that do not reach the grid's border (as scipy's binary_fill_holes), found in the
    ``level_crop`` box only: all empty space outside it reaches the border."""
    crop = level_crop(volume, threshold)
    if crop is None:
        return volume
    solid = volume[crop] > threshold
    labels, _ = ndimage.label(~solid)
    outer = np.zeros(labels.max() + 1, dtype=bool)
    outer[0] = True  # solid samples
    for axis in range(3):
        for end in (0, -1):
            outer[np.take(labels, end, axis=axis)] = True
    pockets = ~outer[labels]
    if not pockets.any():
        return volume
    out = volume.copy()
    out[crop][pockets] = max(float(volume.max()), threshold * 2.0, threshold + 1.0)
    return out


def keep_largest_regions(volume: np.ndarray, threshold: float, count: int = 1) -> np.ndarray:
    """``volume`` with all but the ``count`` largest connected solid regions (samples above ``threshold``,
    26-connected, sized by samples) lowered to its minimum, so only they mesh (floaters dropped on the grid)."""
    if count <= 0:
        return volume
    crop = level_crop(volume, threshold)  # every solid sample lies in it, so its labels are the whole grid's
    if crop is None:
        return volume
    labels, n_regions = ndimage.label(volume[crop] > threshold, structure=np.ones((3, 3, 3), dtype=bool))
    if n_regions <= count:
        return volume
    sizes = np.bincount(labels.ravel(), minlength=n_regions + 1)[1:]
    keep = np.argsort(-sizes, kind="stable")[:count] + 1
    drop = (labels > 0) & ~np.isin(labels, keep)
    log.info("kept %d of %d solid regions (%d of %d samples)", count, n_regions, int(sizes[keep - 1].sum()), int(sizes.sum()))
    out = volume.copy()
    out[crop][drop] = min(float(volume.min()), threshold)
    return out


def keep_largest_components(mesh: Mesh, count: int = 1) -> Mesh:
    """The ``count`` connected components with the most faces (vertices are re-indexed)."""
    if count <= 0 or len(mesh.faces) == 0:
        return mesh
    n = len(mesh.vertices)
    rows = np.concatenate([mesh.faces[:, 0], mesh.faces[:, 1], mesh.faces[:, 2]])
    cols = np.concatenate([mesh.faces[:, 1], mesh.faces[:, 2], mesh.faces[:, 0]])
    graph = coo_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n, n))
    n_parts, labels = connected_components(graph, directed=False)
    if n_parts <= count:
        return mesh
    face_label = labels[mesh.faces[:, 0]]
    sizes = np.bincount(face_label, minlength=n_parts)
    keep = np.argsort(-sizes, kind="stable")[:count]
    kept_faces = np.isin(face_label, keep)
    log.info("kept %d of %d mesh components (%d of %d faces)", count, n_parts, int(kept_faces.sum()), len(mesh.faces))
    return submesh(mesh, kept_faces)


def submesh(mesh: Mesh, face_mask: np.ndarray) -> Mesh:
    """The faces selected by ``face_mask`` [F] with only the vertices they use (attributes follow)."""
    faces = mesh.faces[face_mask]
    is_used = np.zeros(len(mesh.vertices), dtype=bool)
    is_used[faces] = True
    used = np.flatnonzero(is_used)  # as np.unique(faces), without sorting every corner
    remap = np.full(len(mesh.vertices), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))

    kept = mesh if mesh.uv_faces is None else replace(mesh, uv_faces=mesh.uv_faces[face_mask], faces=faces)
    return on_vertices(kept, used, remap[faces])


def on_vertices(mesh: Mesh, index: np.ndarray, faces: np.ndarray) -> Mesh:
    """``mesh`` on its vertices ``index`` [V'] (per-vertex colors, normals and UVs follow) with ``faces`` [F, 3] over
    them; a separate UV index buffer and the texture are kept."""
    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[index]

    uv = pick(mesh.uv) if mesh.uv_faces is None else mesh.uv
    return replace(mesh, vertices=mesh.vertices[index], faces=faces, vertex_colors=pick(mesh.vertex_colors),
                   normals=pick(mesh.normals), uv=uv)


def decimate(mesh: Mesh, target_faces: int) -> Mesh:
    """About ``target_faces`` faces by quadric edge collapse (fast-simplification); attributes are dropped
    (recompute normals and colors on the result)."""
    if target_faces <= 0 or len(mesh.faces) <= target_faces:
        return mesh
    import fast_simplification

    reduction = 1.0 - target_faces / len(mesh.faces)
    vertices, faces = fast_simplification.simplify(mesh.vertices, mesh.faces.astype(np.int32), target_reduction=reduction)
    log.info("decimated the mesh from %d to %d faces", len(mesh.faces), len(faces))
    return Mesh(vertices, faces)


def decimated_to(mesh: Mesh, target_faces: int, color_fn: ColorFn | None, chunk: int = 2**18,
                 device: torch.device | str = "cpu") -> Mesh:
    """A mesh that came whole (a mesh stage's surface) cut to about ``target_faces`` as a meshed field is: decimated,
    its normals and colors (``color_fn`` at the new vertices) taken again. Kept whole when it has UVs (a layout to
    keep), no color function to recolor it, or no more faces than the target."""
    if mesh.uv is not None or color_fn is None or target_faces <= 0 or len(mesh.faces) <= target_faces:
        return mesh
    edges = mesh.vertices[mesh.faces] - mesh.vertices[np.roll(mesh.faces, 1, axis=1)]
    tolerance = 1e-4 * float(np.median(np.linalg.norm(edges, axis=-1)))
    return with_colors(remove_degenerate(decimate(mesh, target_faces), tolerance).with_normals(), color_fn, chunk, device)


def with_colors(mesh: Mesh, color_fn: ColorFn, chunk: int, device: torch.device | str) -> Mesh:
    """``mesh`` with vertex colors from ``color_fn`` at its vertices (clipped to [0, 1])."""
    colors = query_points(color_fn, mesh.vertices, chunk=chunk, device=device, what="meshing: vertex colors")
    return replace(mesh, vertex_colors=np.clip(colors[:, :3], 0.0, 1.0))


def extract_mesh(
    density_fn: DensityFn,
    bbox: BboxLike,
    resolution: int = 256,
    threshold: float | None = None,
    chunk: int = 2**18,
    *,
    color_fn: ColorFn | None = None,
    occupancy: torch.Tensor | np.ndarray | None = None,
    keep_components: int = 0,
    target_faces: int = 0,
    fill_holes: bool = False,
    close_boundary: bool = True,
    opacity_scale: float | None = None,
    device: torch.device | str | None = None,
) -> Mesh:
    """The iso-surface of a density field as a Mesh with normals (and vertex colors from ``color_fn``).

    density_fn: points [N, 3] -> activated density [N] (torch, called under no_grad in cube blocks of
    at most ``chunk`` points). bbox [2, 3]: the region to mesh; ``occupancy`` [Rx, Ry, Rz] (cells tiling
    bbox, e.g. a NeRF's occupancy grid) shrinks it to the occupied cells first. resolution: samples
    along the longest side. threshold: the density iso-level; None picks it with ``auto_threshold``
    (logged) on voxel opacities ``1 - exp(-density * opacity_scale)``, ``opacity_scale`` defaulting to the
    voxel size (right for a NeRF's density per unit length; pass 1 for unitless densities such as a
    Gaussian set's). fill_holes: fill enclosed empty pockets first (one outer surface for shells).
    keep_components: keep the k largest connected parts (0: all). target_faces: decimate (0: off).
    """
    volume, axes, _ = sample_box(density_fn, bbox, resolution, chunk, occupancy, device)
    if threshold is None:
        scale = float(voxel_size(axes).mean()) if opacity_scale is None else float(opacity_scale)
        threshold = auto_threshold(volume, scale)
        log.info("mesh threshold chosen automatically: density %.4g (voxel opacity %.3f)", threshold,
                 -np.expm1(-threshold * scale))
    if not volume.min() < threshold < volume.max():
        raise ValueError(
            f"the threshold {threshold:.4g} is outside the density's range on the grid [{volume.min():.4g}, {volume.max():.4g}]: "
            "no surface. Pick a threshold inside that range, or check the bounding box."
        )
    with Stage("meshing: marching cubes, clean-up" + (f", decimation to {target_faces} faces" if target_faces > 0 else "")):
        if fill_holes:
            volume = fill_cavities(volume, threshold)
        tolerance = 1e-4 * float(voxel_size(axes).min())
        mesh = remove_degenerate(marching_cubes(volume, threshold, axes, close_boundary=close_boundary), tolerance)
        mesh = keep_largest_components(mesh, keep_components)
        mesh = remove_degenerate(decimate(mesh, target_faces), tolerance)
        mesh = mesh.with_normals()
    if color_fn is not None:
        mesh = with_colors(mesh, color_fn, chunk, device)
    log.info("extracted a mesh: %d vertices, %d faces, threshold %.4g, grid %s", len(mesh.vertices), len(mesh.faces),
             threshold, [len(a) for a in axes])
    return mesh
