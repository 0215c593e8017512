"""Textures for meshes: UV atlas with xatlas, albedo baked by querying a color field at the surface
point under every texel (texels rasterized on the field's device, all triangles at once), seams hidden by filling
empty texels from their nearest baked texel.

UV convention (OBJ's and trimesh's): u to the right, v up, (0, 0) at the image's bottom-left, so texel
(row y, column x) of an [H, W] texture sits at u = (x + 0.5) / W, v = 1 - (y + 0.5) / H.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import torch
from scipy import ndimage
from torch import Tensor

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


def rasterize_uv(uvs: np.ndarray, faces: np.ndarray, size: int, chunk: int = 2**22,
                 device: torch.device | str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Which triangle covers each texel center of a ``size`` x ``size`` texture, and where.

    Returns face index [H, W] int64 (-1: no triangle) and barycentric weights [H, W, 3] float32 (numpy).
    Each triangle tests the texel centers of its own bounding box, all triangles at once (flattened), in groups of
    at most ``chunk`` candidates, on ``device`` in float64; a texel on an edge two triangles share goes to the one
    of higher index."""
    face_id, bary = rasterize_uv_tensors(torch.as_tensor(uvs), torch.as_tensor(faces), size, chunk, device)
    return face_id.cpu().numpy(), bary.float().cpu().numpy()


def rasterize_uv_tensors(uvs: Tensor, faces: Tensor, size: int, chunk: int = 2**22,
                         device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """``rasterize_uv`` on ``device``: face index [H, W] long (-1: none) and barycentric weights [H, W, 3] float64."""
    device = torch.device(device)
    uvs, faces = uvs.to(device, torch.float64), faces.to(device, torch.long)
    px = torch.stack([uvs[:, 0] * size, (1.0 - uvs[:, 1]) * size], dim=1)  # [V, 2] (x, y) pixels
    tri = px[faces]  # [F, 3, 2]
    weights = _barycentric_planes(tri)  # [F, 2, 3]: w1, w2 as affine functions of the pixel position
    kept = torch.nonzero(weights.isfinite().all(dim=(1, 2))).view(-1)  # a degenerate triangle covers no texel
    lo = torch.floor(tri.amin(dim=1) - 0.5).clamp(0, size - 1).long()  # first texel index that may be inside
    hi = torch.ceil(tri.amax(dim=1) - 0.5).clamp(0, size - 1).long()
    widths = hi[:, 0] - lo[:, 0] + 1
    counts = widths * (hi[:, 1] - lo[:, 1] + 1)
    starts = torch.cat([counts.new_zeros(1), torch.cumsum(counts[kept], 0)]).cpu()
    face_id = torch.full((size * size,), -1, dtype=torch.long, device=device)
    bary = torch.zeros((size * size, 3), dtype=torch.float64, device=device)
    group_start = 0
    while group_start < len(kept):  # triangles in groups whose candidate texels fit in ``chunk``
        group_end = max(int(torch.searchsorted(starts, starts[group_start] + chunk, right=True)) - 1, group_start + 1)
        sel = kept[group_start: group_end]
        group_counts = counts[sel]
        tri_id = torch.repeat_interleave(sel, group_counts)
        offsets = torch.repeat_interleave(torch.cumsum(group_counts, 0) - group_counts, group_counts)
        local = torch.arange(len(tri_id), device=device) - offsets
        row, column = local.div(widths[tri_id], rounding_mode="floor"), local.remainder(widths[tri_id])
        x, y = lo[tri_id, 0] + column, lo[tri_id, 1] + row
        plane = weights[tri_id]  # [N, 2, 3]
        w12 = plane[:, :, 0] * (x + 0.5)[:, None] + plane[:, :, 1] * (y + 0.5)[:, None] + plane[:, :, 2]
        w = torch.cat([1.0 - w12.sum(dim=1, keepdim=True), w12], dim=1)
        inside = (w >= -1e-7).all(dim=1)
        texel, tri_id, w = (y * size + x)[inside], tri_id[inside], w[inside]
        face_id.scatter_reduce_(0, texel, tri_id, reduce="amax")  # later triangles win, as one after another would
        won = face_id[texel] == tri_id
        bary[texel[won]] = w[won]
        group_start = group_end
    return face_id.view(size, size), bary.view(size, size, 3)


def _barycentric_planes(tri: Tensor) -> Tensor:
    """[F, 2, 3] coefficients (a, b, c) with w1 = a x + b y + c and w2 likewise, the barycentric weights of corners 1
    and 2 of triangles ``tri`` [F, 3, 2] at pixel (x, y); NaN rows for degenerate triangles."""
    a, b, c = tri[:, 0], tri[:, 1], tri[:, 2]
    v0, v1 = b - a, c - a
    den = v0[:, 0] * v1[:, 1] - v1[:, 0] * v0[:, 1]
    den = torch.where(den.abs() > 1e-12, den, torch.full_like(den, float("nan")))
    # w1 = ((p - a) x v1) / den, w2 = (v0 x (p - a)) / den, written out as planes in p
    w1 = torch.stack([v1[:, 1], -v1[:, 0], v1[:, 0] * a[:, 1] - v1[:, 1] * a[:, 0]], dim=1) / den[:, None]
    w2 = torch.stack([-v0[:, 1], v0[:, 0], v0[:, 1] * a[:, 0] - v0[:, 0] * a[:, 1]], dim=1) / den[:, None]
    return torch.stack([w1, w2], dim=1)


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
    device = torch.device(device)
    face_id, bary = rasterize_uv_tensors(torch.as_tensor(mesh.uv), torch.as_tensor(mesh.faces), texture_size,
                                         device=device)
    covered = face_id >= 0
    if not covered.any():
        raise ValueError("no texel center falls inside a triangle of the UV atlas; raise texture_size")
    vertices, faces = torch.as_tensor(mesh.vertices, device=device), torch.as_tensor(mesh.faces, device=device)
    tri = vertices[faces[face_id[covered]]].double()  # [K, 3, 3]
    points = (bary[covered][:, :, None] * tri).sum(dim=1).float()  # the surface point under each covered texel
    colors = np.clip(query_points(color_fn, points, chunk=chunk, device=device, what="texture: colors")[:, :3], 0.0, 1.0)
    covered = covered.cpu().numpy()
    image = np.zeros((texture_size, texture_size, 3), dtype=np.float32)
    image[covered] = colors
    image = fill_empty_texels(image, covered, dilation)
    texture = (image * 255.0 + 0.5).astype(np.uint8)
    log.info("baked a %dx%d texture (%.0f%% of texels on the surface)", texture_size, texture_size, 100 * covered.mean())
    return replace(mesh, texture=texture, vertex_colors=None)
