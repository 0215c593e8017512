"""Textures for meshes: UV atlas with xatlas, albedo baked by querying a color field at the surface
point under every texel, seams hidden by filling empty texels from their nearest baked texel.

UV convention (OBJ's and trimesh's): u to the right, v up, (0, 0) at the image's bottom-left, so texel
(row y, column x) of an [H, W] texture sits at u = (x + 0.5) / W, v = 1 - (y + 0.5) / H.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import torch
from scipy import ndimage

from lift3d.export.grid import ColorFn, query_points
from lift3d.meshes.mesh import Mesh
from lift3d.progress import Stage

log = logging.getLogger(__name__)


def unwrap_uv(mesh: Mesh, texture_size: int = 1024, padding: int = 2) -> Mesh:
    """The mesh cut along UV seams with per-vertex ``uv`` from an xatlas atlas packed for a ``texture_size``
    texture with ``padding`` texels between charts (vertices on seams are duplicated)."""
    import xatlas

    # xatlas skips faces under an absolute area (FLT_EPSILON): unwrap a copy scaled to unit median edge
    edges = mesh.vertices[mesh.faces] - mesh.vertices[np.roll(mesh.faces, 1, axis=1)]
    scale = 1.0 / max(float(np.median(np.linalg.norm(edges, axis=-1))), 1e-30)
    atlas = xatlas.Atlas()
    atlas.add_mesh((mesh.vertices * scale).astype(np.float32), mesh.faces.astype(np.uint32), mesh.normals)
    pack = xatlas.PackOptions()
    pack.resolution = int(texture_size)
    pack.padding = int(padding)
    pack.bilinear = True
    atlas.generate(pack_options=pack)
    vmapping, faces, uvs = atlas[0]
    vmapping = vmapping.astype(np.int64)

    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[vmapping]

    corners = uvs[faces.astype(np.int64)]
    e1, e2 = corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]
    unplaced = int((e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0] == 0).sum())
    if unplaced:
        log.warning("xatlas left %d degenerate face(s) at a single UV point; they take one texel's color", unplaced)
    log.info("UV atlas: %d charts, %d -> %d vertices, %.0f%% of the texture used", atlas.chart_count, len(mesh.vertices),
             len(vmapping), 100 * float(atlas.utilization))
    return Mesh(mesh.vertices[vmapping], faces.astype(np.int64), vertex_colors=pick(mesh.vertex_colors),
                normals=pick(mesh.normals), uv=uvs)


def rasterize_uv(uvs: np.ndarray, faces: np.ndarray, size: int, chunk: int = 2**22) -> tuple[np.ndarray, np.ndarray]:
    """Which triangle covers each texel center of a ``size`` x ``size`` texture, and where.

    Returns face index [H, W] int64 (-1: no triangle) and barycentric weights [H, W, 3] float32.
    Each triangle tests the texel centers of its own bounding box (all triangles at once, flattened)."""
    px = np.stack([uvs[:, 0] * size, (1.0 - uvs[:, 1]) * size], axis=1).astype(np.float64)  # [V, 2] (x, y) pixels
    tri = px[faces]  # [F, 3, 2]
    lo = np.clip(np.floor(tri.min(axis=1) - 0.5), 0, size - 1).astype(np.int64)  # first texel index that may be inside
    hi = np.clip(np.ceil(tri.max(axis=1) - 0.5), 0, size - 1).astype(np.int64)
    widths = hi[:, 0] - lo[:, 0] + 1
    counts = widths * (hi[:, 1] - lo[:, 1] + 1)
    face_id = np.full((size, size), -1, dtype=np.int64)
    bary = np.zeros((size, size, 3), dtype=np.float32)
    starts = np.concatenate([[0], np.cumsum(counts)])
    # process triangles in groups whose candidate texels fit in ``chunk``
    group_start = 0
    while group_start < len(faces):
        group_end = int(np.searchsorted(starts, starts[group_start] + chunk, side="right")) - 1
        group_end = max(group_end, group_start + 1)
        sel = np.arange(group_start, min(group_end, len(faces)))
        tri_id = np.repeat(sel, counts[sel])
        local = np.arange(len(tri_id)) - np.repeat(starts[sel] - starts[sel[0]], counts[sel])
        x = lo[tri_id, 0] + local % widths[tri_id]
        y = lo[tri_id, 1] + local // widths[tri_id]
        w = _barycentric(tri[tri_id], np.stack([x + 0.5, y + 0.5], axis=1))
        inside = (w >= -1e-7).all(axis=1)
        face_id[y[inside], x[inside]] = tri_id[inside]
        bary[y[inside], x[inside]] = w[inside]
        group_start = sel[-1] + 1
    return face_id, bary


def _barycentric(tri: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Barycentric weights [N, 3] of points ``p`` [N, 2] in triangles ``tri`` [N, 3, 2] (degenerate: -1)."""
    a, b, c = tri[:, 0], tri[:, 1], tri[:, 2]
    v0, v1, v2 = b - a, c - a, p - a
    den = v0[:, 0] * v1[:, 1] - v1[:, 0] * v0[:, 1]
    ok = np.abs(den) > 1e-12
    den = np.where(ok, den, 1.0)
    w1 = (v2[:, 0] * v1[:, 1] - v1[:, 0] * v2[:, 1]) / den
    w2 = (v0[:, 0] * v2[:, 1] - v2[:, 0] * v0[:, 1]) / den
    w = np.stack([1.0 - w1 - w2, w1, w2], axis=1)
    w[~ok] = -1.0
    return w


def fill_empty_texels(image: np.ndarray, filled: np.ndarray, max_distance: int | None = None) -> np.ndarray:
    """Copy into each empty texel (``filled`` False) the value of its nearest filled texel, up to
    ``max_distance`` texels away (None: everywhere), so bilinear filtering and mipmaps across chart
    borders read surface colors instead of the background."""
    if filled.all() or not filled.any():
        return image
    distance, (iy, ix) = ndimage.distance_transform_edt(~filled, return_indices=True)
    out = image[iy, ix]
    if max_distance is not None:
        far = distance > max_distance
        out[far] = image[far]
    return out


def bake_texture(
    mesh: Mesh,
    color_fn: ColorFn,
    texture_size: int = 1024,
    padding: int = 2,
    dilation: int | None = None,
    chunk: int = 2**18,
    device: torch.device | str = "cpu",
) -> Mesh:
    """The mesh with a UV atlas and a ``texture_size``² albedo texture: ``color_fn`` queried at the
    surface point under each covered texel; empty texels are filled from the nearest covered one
    (within ``dilation`` texels; None: all). A mesh that already has uvs keeps them."""
    if texture_size < 8:
        raise ValueError(f"texture_size must be at least 8 texels, got {texture_size}")
    if mesh.uv is None:
        with Stage(f"texture: UV atlas of {len(mesh.faces)} faces (xatlas)"):
            mesh = unwrap_uv(mesh, texture_size, padding)
    face_id, bary = rasterize_uv(mesh.uv, mesh.faces, texture_size)
    covered = face_id >= 0
    if not covered.any():
        raise ValueError("no texel center falls inside a triangle of the UV atlas; raise texture_size")
    tri = mesh.vertices[mesh.faces[face_id[covered]]]  # [K, 3, 3]
    points = (bary[covered][:, :, None] * tri).sum(axis=1)
    colors = np.clip(query_points(color_fn, points, chunk=chunk, device=device, what="texture: colors")[:, :3], 0.0, 1.0)
    image = np.zeros((texture_size, texture_size, 3), dtype=np.float32)
    image[covered] = colors
    image = fill_empty_texels(image, covered, dilation)
    texture = (image * 255.0 + 0.5).astype(np.uint8)
    log.info("baked a %dx%d texture (%.0f%% of texels on the surface)", texture_size, texture_size, 100 * covered.mean())
    return replace(mesh, texture=texture, vertex_colors=None)
