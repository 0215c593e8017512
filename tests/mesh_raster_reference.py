"""Brute-force references for the mesh rasterizer tests: per-pixel ray casting against every triangle
(Moller-Trumbore, float64 numpy) and bilinear texture lookup written out by hand."""

from __future__ import annotations

import numpy as np
import torch

from lift3d.cameras import Cameras


def pixel_rays(cameras: Cameras) -> tuple[np.ndarray, np.ndarray]:
    """Origins and directions [B, H, W, 3] (camera-space z = -1, so ray t is camera depth)."""
    origins, directions = cameras.rays(normalized=False)
    return origins.double().numpy(), directions.double().numpy()


def ray_cast(origins: np.ndarray, directions: np.ndarray, vertices: np.ndarray, faces: np.ndarray, near: float = 0.0,
             chunk: int = 256):
    """Nearest hit per ray [R]: face id (-1 none), t, barycentrics [R, 3] of (v0, v1, v2)."""
    v0, v1, v2 = (vertices[faces[:, k]].astype(np.float64) for k in range(3))
    e1, e2 = v1 - v0, v2 - v0
    n_rays = origins.shape[0]
    best_face = np.full(n_rays, -1)
    best_t = np.full(n_rays, np.inf)
    best_bary = np.zeros((n_rays, 3))
    for start in range(0, n_rays, chunk):
        o, d = origins[start : start + chunk, None], directions[start : start + chunk, None]
        p = np.cross(d, e2)
        det = (e1 * p).sum(-1)
        safe = np.where(np.abs(det) > 1e-14, det, 1.0)
        s = o - v0
        u = (s * p).sum(-1) / safe
        q = np.cross(s, e1)
        v = (d * q).sum(-1) / safe
        t = (e2 * q).sum(-1) / safe
        hit = (np.abs(det) > 1e-14) & (u >= 0) & (v >= 0) & (u + v <= 1) & (t > near)
        t = np.where(hit, t, np.inf)
        face = t.argmin(-1)
        rows = np.arange(len(face))
        tt = t[rows, face]
        found = np.isfinite(tt)
        best_face[start : start + chunk] = np.where(found, face, -1)
        best_t[start : start + chunk] = tt
        uu, vv = u[rows, face], v[rows, face]
        best_bary[start : start + chunk] = np.where(found[:, None], np.stack([1 - uu - vv, uu, vv], -1), 0.0)
    return best_face, best_t, best_bary


def render_reference(vertices: torch.Tensor, faces: torch.Tensor, cameras: Cameras, near: float = 0.0):
    """Face ids [B, H, W], depth [B, H, W] (inf: empty) and barycentrics [B, H, W, 3] by ray casting."""
    origins, directions = pixel_rays(cameras)
    shape = origins.shape[:-1]
    face, t, bary = ray_cast(origins.reshape(-1, 3), directions.reshape(-1, 3), vertices.double().numpy(), faces.numpy(), near)
    return face.reshape(shape), t.reshape(shape), bary.reshape(shape + (3,))


def bilinear(texture: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """Texels [N, C] at uv [N, 2] ((0,0) bottom-left; texel centers at (i + 0.5) / size; clamped)."""
    height, width = texture.shape[:2]
    x = np.clip(uv[:, 0] * width - 0.5, 0, width - 1)
    y = np.clip((1.0 - uv[:, 1]) * height - 0.5, 0, height - 1)
    x0, y0 = np.floor(x).astype(int), np.floor(y).astype(int)
    x1, y1 = np.minimum(x0 + 1, width - 1), np.minimum(y0 + 1, height - 1)
    fx, fy = (x - x0)[:, None], (y - y0)[:, None]
    top = texture[y0, x0] * (1 - fx) + texture[y0, x1] * fx
    bottom = texture[y1, x0] * (1 - fx) + texture[y1, x1] * fx
    return top * (1 - fy) + bottom * fy
