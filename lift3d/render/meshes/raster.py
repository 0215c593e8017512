"""Differentiable triangle rasterization in plain PyTorch (CPU and GPU, no compiled extension).

Two passes, as in nvdiffrast's rasterize + interpolate:

1. Visibility (no gradient): every triangle's screen bounding box is enumerated as (triangle, pixel)
   candidates, in chunks of at most ``max_candidates`` so memory stays bounded at any resolution and
   face count. A candidate passes when the pixel center's ray hits the triangle in front of the near
   plane; a z-buffer keeps the nearest hit per pixel with one ``scatter_reduce(amin)`` over 64-bit keys
   ``(float32 depth bits << 32) | face id`` (depth first, face id breaks ties, so the result does not
   depend on the order of the work).
2. Barycentrics (differentiable): for each covered pixel the perspective-correct barycentrics of its
   triangle are recomputed from the clip-space vertices with autograd on, so attributes interpolated
   with them carry gradients to the vertex positions and to the attributes.

Clip coordinates follow OpenGL (``lift3d.cameras.perspective_projection``): NDC x right, y up; pixel
(i, j) has its center at NDC ``(2 (i + 0.5) / W - 1, 1 - 2 (j + 0.5) / H)``. Triangles that cross the
near plane need no clipping: the hit of the pixel ray with the triangle plane is solved in homogeneous
coordinates and rejected where it lies behind the near plane.

Silhouette gradients (coverage changing as vertices move) come from ``mesh_antialias.antialias``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lift3d.cameras import Cameras, perspective_projection

_EMPTY_KEY = torch.iinfo(torch.int64).max
_BBOX_MARGIN = 1e-3  # pixels added around each bounding box; the exact test decides coverage


@dataclass
class Rasterization:
    """Which triangle each pixel sees, stored sparsely over the covered pixels only."""

    batch: int
    height: int
    width: int
    pixels: Tensor  # [N] long: flat index b * H * W + y * W + x of each covered pixel (sorted)
    face_index: Tensor  # [N] long: the triangle seen at that pixel
    barycentrics: Tensor  # [N, 3] perspective-correct (3D) barycentrics; differentiable in clip positions
    depth: Tensor  # [N] camera depth (clip w) of the hit; differentiable

    @property
    def batch_index(self) -> Tensor:
        """[N] which image of the batch each covered pixel belongs to."""
        return torch.div(self.pixels, self.height * self.width, rounding_mode="floor")

    def face_ids(self) -> Tensor:
        """[B, H, W] long: triangle id per pixel, -1 where nothing is hit."""
        ids = torch.full((self.batch * self.height * self.width,), -1, dtype=torch.long, device=self.pixels.device)
        ids[self.pixels] = self.face_index
        return ids.view(self.batch, self.height, self.width)

    def mask(self) -> Tensor:
        """[B, H, W] bool: pixels that see a triangle."""
        return self.face_ids() >= 0

    def to_image(self, values: Tensor, background: float | Tensor = 0.0) -> Tensor:
        """Scatter per-covered-pixel ``values`` [N, C] to an image [B, H, W, C] (differentiable)."""
        total = self.batch * self.height * self.width
        dense = values.new_zeros(total, values.shape[-1]).index_put((self.pixels,), values)
        dense = dense.view(self.batch, self.height, self.width, -1)
        if isinstance(background, Tensor) or background != 0.0:
            covered = torch.zeros(total, dtype=torch.bool, device=values.device)
            covered[self.pixels] = True
            covered = covered.view(self.batch, self.height, self.width, 1)
            dense = torch.where(covered, dense, torch.as_tensor(background).to(dense))
        return dense


def world_to_clip(vertices: Tensor, cameras: Cameras, near: float = 0.01, far: float = 100.0) -> Tensor:
    """Clip-space positions [B, V, 4] of world-space ``vertices`` [V, 3] or [B, V, 3] seen by ``cameras``."""
    dtype = vertices.dtype
    w2c = torch.linalg.inv(cameras.c2w.to(dtype))
    proj = perspective_projection(cameras.intrinsics.to(dtype), cameras.width, cameras.height, near, far)
    mvp = proj @ w2c  # [B, 4, 4]
    if vertices.ndim == 2:
        vertices = vertices.unsqueeze(0).expand(len(cameras), -1, -1)
    if vertices.ndim != 3 or vertices.shape[0] != len(cameras) or vertices.shape[-1] != 3:
        raise ValueError(f"vertices must be [V, 3] or [B, V, 3] with B={len(cameras)}, got {tuple(vertices.shape)}")
    homogeneous = torch.cat([vertices, torch.ones_like(vertices[..., :1])], dim=-1)
    return torch.einsum("bij,bvj->bvi", mvp, homogeneous)


def pixel_to_ndc(ix: Tensor, iy: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
    """NDC coordinates of the centers of pixels (column ``ix``, row ``iy``)."""
    return (2.0 * ix + 1.0) / width - 1.0, 1.0 - (2.0 * iy + 1.0) / height


def _check_inputs(clip: Tensor, faces: Tensor) -> None:
    if clip.ndim != 3 or clip.shape[-1] != 4:
        raise ValueError(f"clip positions must be [B, V, 4], got {tuple(clip.shape)} (use world_to_clip for [V, 3] vertices)")
    if faces.ndim != 2 or faces.shape[-1] != 3 or faces.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"faces must be an integer [F, 3] tensor, got {tuple(faces.shape)} {faces.dtype}")
    if faces.numel() and (int(faces.min()) < 0 or int(faces.max()) >= clip.shape[1]):
        raise ValueError(f"faces index vertices outside 0..{clip.shape[1] - 1}")


def _triangle_coefficients(tri: Tensor) -> Tensor:
    """Per-triangle affine screen functions [..., 13] from clip vertices ``tri`` [..., 3, 4].

    For a pixel at NDC (x, y) the unnormalized barycentrics are ``n_k = A_k + B_k x + C_k y`` (the rows
    of the adjugate of the matrix of (X, Y, W) rows, i.e. 2D homogeneous edge functions); the hit's
    clip w is ``det / sum(n)`` and its clip z is ``(Z_A + Z_B x + Z_C y) / sum(n)``.
    Layout: A(3), B(3), C(3), det, Z_A, Z_B, Z_C.
    """
    X, Y, Z, W = tri.unbind(-1)  # each [..., 3]
    roll = [1, 2, 0]
    roll2 = [2, 0, 1]
    X1, X2, Y1, Y2, W1, W2 = X[..., roll], X[..., roll2], Y[..., roll], Y[..., roll2], W[..., roll], W[..., roll2]
    A = X1 * Y2 - X2 * Y1
    B = W2 * Y1 - W1 * Y2
    C = X2 * W1 - X1 * W2
    det = (A * W).sum(-1, keepdim=True)
    z = torch.stack([(A * Z).sum(-1), (B * Z).sum(-1), (C * Z).sum(-1)], dim=-1)
    return torch.cat([A, B, C, det, z], dim=-1)


def _screen_bounds(tri: Tensor, width: int, height: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Inclusive pixel ranges (x0, x1, y0, y1) [...] covering the part of each triangle [..., 3, 4] in
    front of the near plane (empty ranges have x1 < x0 or y1 < y0)."""
    d = tri[..., 2] + tri[..., 3]  # >= 0 in front of the near plane (clip z >= -w)
    points, valid = [tri], [d >= 0]
    for i, j in ((0, 1), (1, 2), (2, 0)):  # where an edge crosses the near plane
        di, dj = d[..., i], d[..., j]
        crosses = (di >= 0) != (dj >= 0)
        t = (di / torch.where(crosses, di - dj, torch.ones_like(di))).unsqueeze(-1)
        points.append((tri[..., i, :] + t * (tri[..., j, :] - tri[..., i, :])).unsqueeze(-2))
        valid.append(crosses.unsqueeze(-1))
    points, valid = torch.cat(points, dim=-2), torch.cat(valid, dim=-1)  # [..., 6, 4], [..., 6]
    w = points[..., 3].clamp_min(1e-12)
    px = ((points[..., 0] / w + 1.0) * (0.5 * width) - 0.5).clamp(-2.0, width + 1.0)
    py = ((1.0 - points[..., 1] / w) * (0.5 * height) - 0.5).clamp(-2.0, height + 1.0)
    big = torch.tensor(float(max(width, height) + 8), dtype=px.dtype, device=px.device)
    x0 = torch.where(valid, px, big).amin(-1)
    x1 = torch.where(valid, px, -big).amax(-1)
    y0 = torch.where(valid, py, big).amin(-1)
    y1 = torch.where(valid, py, -big).amax(-1)
    x0 = torch.ceil(x0 - _BBOX_MARGIN).clamp(0, width - 1).long()
    y0 = torch.ceil(y0 - _BBOX_MARGIN).clamp(0, height - 1).long()
    x1 = torch.floor(x1 + _BBOX_MARGIN).clamp(-1, width - 1).long()
    y1 = torch.floor(y1 + _BBOX_MARGIN).clamp(-1, height - 1).long()
    return x0, x1, y0, y1


def _chunks(counts: Tensor, max_candidates: int) -> list[tuple[int, int]]:
    """Split consecutive triangles into runs whose candidate counts sum to at most ``max_candidates``
    (a single larger triangle gets a run of its own)."""
    cumulative = torch.cumsum(counts, 0).cpu()
    runs, start, done = [], 0, 0
    n = len(cumulative)
    while start < n:
        end = int(torch.searchsorted(cumulative, done + max_candidates, right=True))
        end = max(end, start + 1)
        runs.append((start, end))
        done = int(cumulative[end - 1])
        start = end
    return runs


@torch.no_grad()
def _visibility(clip: Tensor, faces: Tensor, height: int, width: int, max_candidates: int) -> Tensor:
    """Z-buffer keys [B * H * W] (int64; ``_EMPTY_KEY`` where empty): nearest triangle per pixel."""
    batch, num_faces = clip.shape[0], faces.shape[0]
    zbuffer = torch.full((batch * height * width,), _EMPTY_KEY, dtype=torch.long, device=clip.device)
    if num_faces == 0:
        return zbuffer
    tri = clip.float()[:, faces]  # [B, F, 3, 4]
    x0, x1, y0, y1 = _screen_bounds(tri, width, height)
    box_w = (x1 - x0 + 1).clamp_min(0)
    counts = (box_w * (y1 - y0 + 1).clamp_min(0)).reshape(-1)  # [B * F]
    live = torch.nonzero(counts > 0).squeeze(-1)  # flat (b * F + f) of triangles with candidates
    if live.numel() == 0:
        return zbuffer
    counts = counts[live]
    coef = _triangle_coefficients(tri.reshape(-1, 3, 4)[live])  # [L, 13]
    x0, y0, box_w = x0.reshape(-1)[live], y0.reshape(-1)[live], box_w.reshape(-1)[live]
    batch_of, face_of = torch.div(live, num_faces, rounding_mode="floor"), live % num_faces
    for start, end in _chunks(counts, max_candidates):
        n_cand = counts[start:end]
        owner = torch.repeat_interleave(torch.arange(start, end, device=clip.device), n_cand)
        first = torch.cumsum(n_cand, 0) - n_cand  # offset of each triangle's first candidate
        offset = torch.arange(owner.numel(), device=clip.device) - first[owner - start]
        ix = x0[owner] + offset % box_w[owner]
        iy = y0[owner] + torch.div(offset, box_w[owner], rounding_mode="floor")
        x, y = pixel_to_ndc(ix.float(), iy.float(), width, height)
        c = coef[owner]
        n = c[:, 0:3] + c[:, 3:6] * x[:, None] + c[:, 6:9] * y[:, None]  # [M, 3]
        s = n.sum(-1)
        w_num, z_num = c[:, 9], c[:, 10] + c[:, 11] * x + c[:, 12] * y
        hit = (
            (n * s[:, None] >= 0).all(-1)  # inside the triangle (all barycentrics >= 0)
            & (s != 0)
            & (w_num * s > 0)  # in front of the camera
            & ((z_num + w_num) * s >= 0)  # in front of the near plane
            & ((w_num - z_num) * s >= 0)  # before the far plane
        )
        if not bool(hit.any()):
            continue
        depth = (w_num / s)[hit]
        key = (depth.view(torch.int32).long() << 32) | face_of[owner[hit]]
        pixel = (batch_of[owner[hit]] * height + iy[hit]) * width + ix[hit]
        zbuffer.scatter_reduce_(0, pixel, key, reduce="amin")
    return zbuffer


def barycentrics_at(tri: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Perspective-correct barycentrics [N, 3] and clip w [N] of the hits of the rays through NDC
    points (x, y) [N] with triangles of clip vertices ``tri`` [N, 3, 4] (differentiable)."""
    a = tri[..., 0] - x[:, None] * tri[..., 3]
    c = tri[..., 1] - y[:, None] * tri[..., 3]
    n = torch.cross(a, c, dim=-1)  # solves sum_k b_k (X_k - x W_k) = sum_k b_k (Y_k - y W_k) = 0
    bary = n / n.sum(-1, keepdim=True)
    return bary, (bary * tri[..., 3]).sum(-1)


def rasterize(clip: Tensor, faces: Tensor, height: int, width: int, max_candidates: int = 1 << 22) -> Rasterization:
    """Rasterize triangles ``faces`` [F, 3] of clip-space vertices ``clip`` [B, V, 4] to H x W images.

    ``max_candidates`` bounds the (triangle, pixel) pairs tested at once (about 100 bytes each).
    """
    _check_inputs(clip, faces)
    faces = faces.long()
    batch = clip.shape[0]
    zbuffer = _visibility(clip, faces, height, width, max_candidates)
    pixels = torch.nonzero(zbuffer != _EMPTY_KEY).squeeze(-1)
    face_index = zbuffer[pixels] & 0xFFFFFFFF
    hw = height * width
    b = torch.div(pixels, hw, rounding_mode="floor")
    rem = pixels - b * hw
    iy = torch.div(rem, width, rounding_mode="floor")
    ix = rem - iy * width
    x, y = pixel_to_ndc(ix.to(clip.dtype), iy.to(clip.dtype), width, height)
    tri = clip[b[:, None], faces[face_index]]  # [N, 3, 4]
    bary, depth = barycentrics_at(tri, x, y)
    return Rasterization(batch, height, width, pixels, face_index, bary, depth)


def interpolate(attributes: Tensor, rast: Rasterization, faces: Tensor) -> Tensor:
    """Attributes [N, C] at the covered pixels, interpolated perspective-correctly.

    ``attributes``: per vertex [V, C], per vertex and view [B, V, C], or per face corner [F, 3, C]
    (then ``faces`` is unused and may be None). ``faces`` [F, 3] indexes the attribute rows, so a
    separate index buffer (e.g. UV faces) can be passed here.
    """
    if attributes.ndim == 3 and faces is None:  # per face corner
        corner = attributes[rast.face_index]
    elif attributes.ndim == 2:
        corner = attributes[faces[rast.face_index]]
    elif attributes.ndim == 3:
        if attributes.shape[0] != rast.batch:
            raise ValueError(f"batched attributes must be [B={rast.batch}, V, C], got {tuple(attributes.shape)}")
        corner = attributes[rast.batch_index[:, None], faces[rast.face_index]]
    else:
        raise ValueError(f"attributes must be [V, C], [B, V, C] or [F, 3, C] (faces=None), got {tuple(attributes.shape)}")
    return (rast.barycentrics.unsqueeze(-1).to(corner.dtype) * corner).sum(-2)
