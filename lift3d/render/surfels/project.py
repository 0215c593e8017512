"""Surfels into cameras, with the numerics of gsplat's 2DGS projection: pure functions on tensors.

A surfel is a center ``mean``, two tangent axes (the first two columns of its rotation) with scales ``s_u``, ``s_v``
and the normal (the third column). In camera ``c`` the 3 x 3 ray transform ``T = K [s_u R_c t_u, s_v R_c t_v, mean_c]``
maps the surfel's local homogeneous point (u, v, 1) to the homogeneous pixel (x z, y z, z); a pixel's ray meets the
surfel's plane at local coordinates ``s = (zeta_0, zeta_1) / zeta_2`` with ``zeta = adj(T) (x, y, 1)`` (gsplat writes it
as the cross product of the two homogeneous planes through the pixel). The screen bounding box is that of the surfel's
1-sigma ellipse, times 3.33; its center ``means2d`` is where the 2DGS low-pass filter is centered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lift3d.rotations import quaternion_to_matrix

MAX_EXTENT = 3.33  # bounding-box half-size in standard deviations (gsplat's)
FILTER_INV_SQUARE = 2.0  # the 2DGS low-pass filter: sigma_2d = 2 |pixel - means2d|^2 (a 1/sqrt(2) px wide Gaussian)


@dataclass
class SurfelProjection:
    """Per camera and surfel screen-space quantities; entries with ``radii == 0`` are culled."""

    ray_transforms: Tensor  # [C, N, 3, 3] T = K [s_u t_u, s_v t_v, mean] in camera space, rows (u_M, v_M, w_M)
    means2d: Tensor  # [C, N, 2] center of the screen bounding box (pixel centers at i + 0.5)
    depths: Tensor  # [C, N] camera-space z of the center (the depth every pixel of the surfel composites)
    normals: Tensor  # [C, N, 3] unit world-space normals, turned to face the camera
    radii: Tensor  # [C, N, 2] int32 bounding-box half-sizes in pixels (x, y); 0 where culled

    @property
    def visible(self) -> Tensor:
        """[C, N] bool: not culled."""
        return (self.radii > 0).all(dim=-1)

    @property
    def conics(self) -> Tensor:
        """Placeholder conics [C, N, 3] (zeros), so the 3D Gaussian rasterizer's tile binning can read this projection."""
        return self.means2d.new_zeros(self.means2d.shape[:-1] + (3,))


def pinhole(Ks: Tensor) -> Tensor:
    """[C, 3, 3] the intrinsics as gsplat's 2DGS reads them: fx, fy, cx, cy (no skew)."""
    out = torch.zeros_like(Ks)
    out[:, 0, 0], out[:, 1, 1], out[:, 0, 2], out[:, 1, 2], out[:, 2, 2] = (
        Ks[:, 0, 0], Ks[:, 1, 1], Ks[:, 0, 2], Ks[:, 1, 2], 1.0)
    return out


def bounding_boxes(T: Tensor) -> tuple[Tensor, Tensor]:
    """(center [..., 2], half-size at 1 sigma [..., 2]) of the screen boxes of ray transforms ``T`` [..., 3, 3]: the
    projected unit circle as a conic, its center and extents (nan-free: a degenerate conic gives zeros)."""
    flip = T.new_tensor([1.0, 1.0, -1.0])
    u_M, v_M, w_M = T[..., 0, :], T[..., 1, :], T[..., 2, :]
    distance = (flip * w_M * w_M).sum(-1, keepdim=True)
    ok = distance != 0
    f = flip / torch.where(ok, distance, torch.ones_like(distance))
    center = torch.stack([(f * u_M * w_M).sum(-1), (f * v_M * w_M).sum(-1)], dim=-1)
    spread = center * center - torch.stack([(f * u_M * u_M).sum(-1), (f * v_M * v_M).sum(-1)], dim=-1)
    zero = torch.zeros_like(center)
    return torch.where(ok, center, zero), torch.where(ok, spread.clamp_min(1e-4).sqrt(), zero)


def project_surfels(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] wxyz, any norm
    scales: Tensor,  # [N, 2] or [N, 3] activated (a third scale is ignored: surfels are flat)
    viewmats: Tensor,  # [C, 4, 4] world-to-camera, OpenCV axes
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
) -> SurfelProjection:
    """Project N surfels into C cameras (differentiable in means, quats, scales; culling is not). A surfel is culled
    when its center's depth is outside (near, far), its box is degenerate, no larger than ``radius_clip`` pixels, or
    off the image."""
    R, t = viewmats[:, None, :3, :3], viewmats[:, None, :3, 3]  # [C, 1, 3, 3], [C, 1, 3]
    means_c = (R * means[None, :, None, :]).sum(-1) + t  # [C, N, 3]
    rot = quaternion_to_matrix(quats)  # [N, 3, 3]
    axes = rot[:, :, :2] * scales[:, None, :2]  # [N, 3, 2] the scaled tangent axes (columns)
    axes_c = (R[..., :, :, None] * axes[None, :, None, :, :]).sum(-2)  # [C, N, 3, 2]
    WH = torch.cat([axes_c, means_c[..., None]], dim=-1)  # [C, N, 3, 3]
    T = (pinhole(Ks)[:, None, :, :, None] * WH[..., None, :, :]).sum(-2)  # K @ WH, exact float32
    center, spread = bounding_boxes(T)
    normal = rot[:, :, 2][None].expand(len(viewmats), -1, -1)  # [C, N, 3] world space
    camera = -(viewmats[:, None, :3, :3].transpose(-1, -2) @ viewmats[:, None, :3, 3:])[..., 0]  # [C, 1, 3] centers
    with torch.no_grad():
        facing = ((camera - means[None]) * normal).sum(-1, keepdim=True) > 0  # gsplat: dot(-n_c, mean_c) > 0 keeps n
        z = means_c[..., 2]
        flat = T[..., 2, :]
        ok = (z > near_plane) & (z < far_plane) & ((flat * flat * flat.new_tensor([1.0, 1.0, -1.0])).sum(-1) != 0)
        radius = torch.ceil(MAX_EXTENT * spread.detach())
        ok &= (radius > radius_clip).any(-1)
        cx, cy = center.detach().unbind(-1)
        ok &= (cx + radius[..., 0] > 0) & (cx - radius[..., 0] < width) & (cy + radius[..., 1] > 0)
        ok &= cy - radius[..., 1] < height
        radii = torch.where(ok[..., None], radius, torch.zeros_like(radius)).to(torch.int32)
    normals = torch.where(facing, normal, -normal)
    return SurfelProjection(ray_transforms=T, means2d=center, depths=means_c[..., 2], normals=normals, radii=radii)
