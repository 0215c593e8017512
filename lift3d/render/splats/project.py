"""EWA projection of 3D Gaussians to image-space ellipses, with the numerics of gsplat 1.5.

Pure functions on tensors. Cameras come as OpenCV world-to-camera matrices (``viewmats``, what
``Cameras.w2c_opencv()`` returns) and pinhole ``Ks``. The 2D covariance gets a 0.3 px^2 low-pass
dilation (``eps2d``); a Gaussian is culled (radii 0) when its center is outside [near, far], its
dilated covariance is degenerate, its opacity is below 1/255, or its bounding box misses the image.
The bounding box is the tight opacity-aware one: half-extents ``ceil(e * sqrt(cov_xx))`` and
``ceil(e * sqrt(cov_yy))`` with ``e = min(3.33, sqrt(2 ln(255 opacity)))``, outside of which every
pixel's alpha is below the 1/255 skip threshold.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from lift3d.rotations import quaternion_to_matrix

ALPHA_THRESHOLD = 1.0 / 255.0  # alphas below this are skipped when compositing
MAX_EXTENT = 3.33  # cap on the bounding-box size in standard deviations


@dataclass
class Projection:
    """Per camera and Gaussian image-space quantities; entries with ``radii == 0`` are culled."""

    means2d: Tensor  # [C, N, 2] pixel coordinates of the centers (pixel centers at i + 0.5)
    conics: Tensor  # [C, N, 3] (a, b, c) of the inverse 2D covariance [[a, b], [b, c]]
    depths: Tensor  # [C, N] camera-space z
    radii: Tensor  # [C, N, 2] int32 bounding-box half-extents in pixels (x, y); 0 where culled
    compensations: Tensor | None = None  # [C, N] antialiased mode: the opacity factor of the 2D filter (else None)

    @property
    def visible(self) -> Tensor:
        """[C, N] bool: not culled."""
        return (self.radii > 0).all(dim=-1)


@contextmanager
def exact_float32_matmuls() -> Iterator[None]:
    """Full float32 matmuls inside, whatever the run's global precision: with TF32 (10-bit mantissa, what recipes
    set on CUDA for their MLPs) a Gaussian's exponent over a tile, hundreds of squared pixels times its conic,
    is off by whole units, and its opacity at a pixel by tens of percent."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def small_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for small matrices [..., m, k] x [..., k, n] as products and sums: exact float32 in the forward and
    the backward whatever the global matmul precision (the projection's covariances feed a matrix inverse)."""
    return (a[..., :, :, None] * b[..., None, :, :]).sum(-2)


def covariance_3d(quats: Tensor, scales: Tensor) -> Tensor:
    """World covariances [N, 3, 3] = R S S^T R^T of quaternions [N, 4] and scales [N, 3] (activated)."""
    M = quaternion_to_matrix(quats) * scales[..., None, :]
    return small_matmul(M, M.transpose(-1, -2))


def project_gaussians(
    means: Tensor,  # [N, 3]
    covars: Tensor,  # [N, 3, 3]
    opacities: Tensor,  # [N] activated, in (0, 1)
    viewmats: Tensor,  # [C, 4, 4] world-to-camera, OpenCV axes
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    antialiased: bool = False,
) -> Projection:
    """Project Gaussians into C cameras (differentiable in means, covars; culling is not).

    ``antialiased`` (gsplat's ``rasterize_mode="antialiased"``, Mip-Splatting's 2D filter): the dilation keeps the
    Gaussian's mass by scaling its opacity by sqrt(det(cov2d) / det(cov2d + eps2d I)), returned as ``compensations``
    (the caller multiplies the opacities); the culling and bounding box use the compensated opacity, as gsplat's."""
    R = viewmats[:, None, :3, :3]  # [C, 1, 3, 3]
    t = viewmats[:, None, :3, 3]  # [C, 1, 3]
    means_c = (R * means[None, :, None, :]).sum(-1) + t  # [C, N, 3]
    cov_c = small_matmul(small_matmul(R, covars[None]), R.transpose(-1, -2))  # [C, N, 3, 3]
    x, y, z = means_c.unbind(-1)
    in_depth = (z >= near_plane) & (z <= far_plane)
    z = torch.where(in_depth, z, torch.ones_like(z))  # keeps culled entries finite (and their gradients)

    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]  # [C, 1]
    cx, cy = Ks[:, 0, 2, None], Ks[:, 1, 2, None]
    # the Jacobian is evaluated with the center clamped to 1.3x the field of view (as 3DGS and gsplat)
    margin_x, margin_y = 0.3 * 0.5 * width / fx, 0.3 * 0.5 * height / fy
    tx = z * torch.clamp(x / z, min=-(cx / fx + margin_x), max=(width - cx) / fx + margin_x)
    ty = z * torch.clamp(y / z, min=-(cy / fy + margin_y), max=(height - cy) / fy + margin_y)
    j00, j11 = fx / z, fy / z
    j02, j12 = -fx * tx / (z * z), -fy * ty / (z * z)
    s00, s01, s02 = cov_c[..., 0, 0], cov_c[..., 0, 1], cov_c[..., 0, 2]
    s11, s12, s22 = cov_c[..., 1, 1], cov_c[..., 1, 2], cov_c[..., 2, 2]
    a = j00 * j00 * s00 + 2 * j00 * j02 * s02 + j02 * j02 * s22 + eps2d
    b = j00 * j11 * s01 + j00 * j12 * s02 + j02 * j11 * s12 + j02 * j12 * s22
    c = j11 * j11 * s11 + 2 * j11 * j12 * s12 + j12 * j12 * s22 + eps2d
    det = a * c - b * b
    compensations = None
    if antialiased:  # sqrt(max(0, det(cov2d) / det(cov2d + eps2d I))), as gsplat's add_blur
        det_orig = (a - eps2d) * (c - eps2d) - b * b
        ratio = det_orig / torch.where(det > 0, det, torch.ones_like(det))
        compensations = torch.sqrt(ratio.clamp_min(1e-12)) * (ratio > 0)  # clamped: a finite gradient at 0
    ok = in_depth & (det > 0)
    det = torch.where(ok, det, torch.ones_like(det))
    conics = torch.stack([c / det, -b / det, a / det], dim=-1)
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)

    with torch.no_grad():
        opacity = opacities.detach()[None].expand_as(z)
        if compensations is not None:
            opacity = opacity * compensations.detach()
        ok = ok & (opacity >= ALPHA_THRESHOLD)
        extent = torch.sqrt(2.0 * torch.log(opacity.clamp_min(ALPHA_THRESHOLD) / ALPHA_THRESHOLD)).clamp_max(MAX_EXTENT)
        rx = torch.ceil(extent * torch.sqrt(a.detach().clamp_min(0)))
        ry = torch.ceil(extent * torch.sqrt(c.detach().clamp_min(0)))
        mx, my = means2d.detach().unbind(-1)
        ok = ok & ((rx > 0) | (ry > 0))
        ok = ok & (mx + rx > 0) & (mx - rx < width) & (my + ry > 0) & (my - ry < height)
        radii = torch.where(ok[..., None], torch.stack([rx, ry], dim=-1), torch.zeros_like(means2d)).to(torch.int32)
    return Projection(means2d=means2d, conics=conics, depths=means_c[..., 2], radii=radii, compensations=compensations)


def extent_for_opacity(opacity: float) -> float:
    """Bounding-box size in standard deviations for one opacity (documentation and tests)."""
    return min(MAX_EXTENT, math.sqrt(max(2.0 * math.log(opacity / ALPHA_THRESHOLD), 0.0)))
