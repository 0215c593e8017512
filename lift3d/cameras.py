"""Camera math as pure functions, plus the ``Cameras`` batch every renderer takes.

Conventions (the only place they are converted):
* world: right-handed, +z up (as Blender and the NeRF-synthetic scenes);
* ``c2w``: camera-to-world 4x4, OpenGL camera axes (x right, y up, the camera looks down -z);
* OpenCV camera axes (x right, y down, looks down +z) only for backends that want them (gsplat);
* ``intrinsics``: 3x3 pinhole matrix in pixels, pixel centers at (i + 0.5, j + 0.5);
* spherical: elevation above the xy-plane, azimuth from +x towards +y; radians in code, degrees in
  configs and in batch keys ending in ``_deg``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor


def normalize(v: Tensor, eps: float = 1e-12) -> Tensor:
    """Unit vectors along the last axis."""
    return v / v.norm(dim=-1, keepdim=True).clamp_min(eps)


def look_at(eye: Tensor, target: Tensor, up: Tensor) -> Tensor:
    """c2w [..., 4, 4] (OpenGL axes) of cameras at ``eye`` [..., 3] looking at ``target`` [..., 3]."""
    eye, target, up = torch.broadcast_tensors(eye, target, up.to(eye))
    forward = normalize(target - eye)
    right = torch.cross(forward, up, dim=-1)
    # looking straight along ``up``: any right vector perpendicular to forward will do
    degenerate = right.norm(dim=-1, keepdim=True) < 1e-6
    fallback = torch.cross(forward, torch.tensor([0.0, 1.0, 0.0]).to(eye).expand_as(forward), dim=-1)
    right = normalize(torch.where(degenerate, fallback, right))
    true_up = torch.cross(right, forward, dim=-1)
    c2w = torch.zeros(eye.shape[:-1] + (4, 4), dtype=eye.dtype, device=eye.device)
    c2w[..., :3, 0] = right
    c2w[..., :3, 1] = true_up
    c2w[..., :3, 2] = -forward
    c2w[..., :3, 3] = eye
    c2w[..., 3, 3] = 1.0
    return c2w


def spherical_to_position(elevation: Tensor, azimuth: Tensor, distance: Tensor) -> Tensor:
    """Points [..., 3] at (elevation, azimuth) radians and ``distance`` from the origin, +z up."""
    return torch.stack(
        [
            distance * torch.cos(elevation) * torch.cos(azimuth),
            distance * torch.cos(elevation) * torch.sin(azimuth),
            distance * torch.sin(elevation),
        ],
        dim=-1,
    )


def spherical_to_c2w(
    elevation: Tensor, azimuth: Tensor, distance: Tensor, target: Tensor | None = None
) -> Tensor:
    """c2w [..., 4, 4] of cameras on a sphere (radians) looking at ``target`` (default origin), +z up."""
    eye = spherical_to_position(elevation, azimuth, distance)
    target = torch.zeros_like(eye) if target is None else target.to(eye).expand_as(eye)
    up = torch.tensor([0.0, 0.0, 1.0], dtype=eye.dtype, device=eye.device).expand_as(eye)
    return look_at(eye, target, up)


def c2w_to_spherical(c2w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(elevation, azimuth, distance) in radians of the camera centers of ``c2w`` [..., 4, 4]."""
    position = c2w[..., :3, 3]
    distance = position.norm(dim=-1)
    elevation = torch.asin((position[..., 2] / distance.clamp_min(1e-12)).clamp(-1.0, 1.0))
    azimuth = torch.atan2(position[..., 1], position[..., 0])
    return elevation, azimuth, distance


def focal_from_fov(fov: float | Tensor, size: int) -> float | Tensor:
    """Focal length in pixels for a full field of view ``fov`` (radians) across ``size`` pixels."""
    tan = torch.tan(fov * 0.5) if isinstance(fov, Tensor) else math.tan(fov * 0.5)
    return 0.5 * size / tan


def fov_from_focal(focal: float | Tensor, size: int) -> float | Tensor:
    """Full field of view (radians) of ``size`` pixels at focal length ``focal`` (pixels)."""
    if isinstance(focal, Tensor):
        return 2.0 * torch.atan(0.5 * size / focal)
    return 2.0 * math.atan(0.5 * size / focal)


def intrinsics_matrix(fx: Tensor, fy: Tensor, cx: Tensor, cy: Tensor) -> Tensor:
    """Pinhole matrices [..., 3, 3] from per-camera focal lengths and principal points (pixels)."""
    fx, fy, cx, cy = torch.broadcast_tensors(*(torch.as_tensor(v, dtype=torch.float32) for v in (fx, fy, cx, cy)))
    K = torch.zeros(fx.shape + (3, 3), dtype=fx.dtype, device=fx.device)
    K[..., 0, 0], K[..., 1, 1], K[..., 0, 2], K[..., 1, 2], K[..., 2, 2] = fx, fy, cx, cy, 1.0
    return K


def intrinsics_from_fovy(fovy: Tensor, width: int, height: int) -> Tensor:
    """Intrinsics [..., 3, 3] with vertical field of view ``fovy`` (radians), square pixels, centered."""
    fovy = torch.as_tensor(fovy, dtype=torch.float32)
    focal = focal_from_fov(fovy, height)
    return intrinsics_matrix(focal, focal, torch.full_like(fovy, width / 2), torch.full_like(fovy, height / 2))


def camera_rays(c2w: Tensor, intrinsics: Tensor, width: int, height: int, normalized: bool = True) -> tuple[Tensor, Tensor]:
    """Ray origins and directions [B, H, W, 3] in world space through each pixel center.

    With ``normalized=False`` directions have camera-space z = -1, so ray parameter t is depth.
    """
    device, dtype = c2w.device, c2w.dtype
    j, i = torch.meshgrid(
        torch.arange(height, device=device, dtype=dtype) + 0.5,
        torch.arange(width, device=device, dtype=dtype) + 0.5,
        indexing="ij",
    )
    fx, fy = intrinsics[:, 0, 0, None, None], intrinsics[:, 1, 1, None, None]
    cx, cy = intrinsics[:, 0, 2, None, None], intrinsics[:, 1, 2, None, None]
    # OpenGL camera axes: +y up, looking down -z
    directions_cam = torch.stack([(i - cx) / fx, -(j - cy) / fy, -torch.ones_like(i - cx)], dim=-1)
    directions = torch.einsum("bij,bhwj->bhwi", c2w[:, :3, :3], directions_cam)
    if normalized:
        directions = normalize(directions)
    origins = c2w[:, None, None, :3, 3].expand_as(directions)
    return origins, directions


def opengl_to_opencv(c2w: Tensor) -> Tensor:
    """Flip camera y and z axes: OpenGL c2w -> OpenCV c2w (the conversion is its own inverse). Negating the
    two columns, not multiplying by a constant matrix: that would copy the constant to the GPU, a host wait per call."""
    return torch.cat([c2w[..., :1], -c2w[..., 1:3], c2w[..., 3:]], dim=-1)


opencv_to_opengl = opengl_to_opencv


def invert_affine(m: Tensor) -> Tensor:
    """Inverse of affine transforms [..., 4, 4] (last row 0 0 0 1) by the 3x3 adjugate: a few elementwise kernels,
    where a batched LU inverse costs a solver dispatch of tenths of a millisecond of host time in every render."""
    a, t = m[..., :3, :3], m[..., :3, 3:]
    c0, c1, c2 = a[..., :, 0], a[..., :, 1], a[..., :, 2]
    rows = torch.stack([torch.linalg.cross(c1, c2), torch.linalg.cross(c2, c0), torch.linalg.cross(c0, c1)], dim=-2)
    inverse = rows / (rows[..., 0, :] * c0).sum(-1)[..., None, None]
    top = torch.cat([inverse, -inverse @ t], dim=-1)
    return torch.cat([top, m[..., 3:, :]], dim=-2)


def w2c_opencv(c2w: Tensor) -> Tensor:
    """World-to-camera [..., 4, 4] in OpenCV axes (what gsplat's ``viewmats`` take) from OpenGL c2w."""
    return invert_affine(opengl_to_opencv(c2w))


def perspective_projection(intrinsics: Tensor, width: int, height: int, near: float, far: float) -> Tensor:
    """OpenGL clip-space projection [B, 4, 4] matching pinhole ``intrinsics`` (for mesh rasterizers)."""
    fx, fy = intrinsics[:, 0, 0], intrinsics[:, 1, 1]
    cx, cy = intrinsics[:, 0, 2], intrinsics[:, 1, 2]
    P = torch.zeros(intrinsics.shape[0], 4, 4, dtype=intrinsics.dtype, device=intrinsics.device)
    P[:, 0, 0] = 2 * fx / width
    P[:, 1, 1] = 2 * fy / height
    P[:, 0, 2] = 1 - 2 * cx / width
    P[:, 1, 2] = 2 * cy / height - 1
    P[:, 2, 2] = -(far + near) / (far - near)
    P[:, 2, 3] = -2 * far * near / (far - near)
    P[:, 3, 2] = -1.0
    return P


def orbit_c2w(
    n_views: int,
    elevation_deg: float,
    distance: float,
    start_azimuth_deg: float = 0.0,
    target: Tensor | None = None,
) -> Tensor:
    """c2w [n_views, 4, 4] evenly spaced around a full turn at fixed elevation (a turntable)."""
    azimuth = torch.deg2rad(start_azimuth_deg + torch.arange(n_views, dtype=torch.float32) * 360.0 / n_views)
    elevation = torch.full_like(azimuth, math.radians(elevation_deg))
    return spherical_to_c2w(elevation, azimuth, torch.full_like(azimuth, distance), target)


@dataclass
class Cameras:
    """A batch of pinhole cameras of one image size: what every renderer takes."""

    c2w: Tensor  # [B, 4, 4] camera-to-world, OpenGL axes
    intrinsics: Tensor  # [B, 3, 3] pixels
    width: int
    height: int
    # world-to-camera [B, 4, 4] in OpenCV axes when precomputed (training views gathered from a resident set): spares
    # every render its inversion; ``w2c_opencv()`` computes it when absent. Derived from c2w, never set independently.
    viewmats: Tensor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.c2w.ndim != 3 or self.c2w.shape[-2:] != (4, 4):
            raise ValueError(f"Cameras.c2w must be [B, 4, 4], got {tuple(self.c2w.shape)}")
        if self.intrinsics.shape != (self.c2w.shape[0], 3, 3):
            raise ValueError(f"Cameras.intrinsics must be [B, 3, 3] with B={self.c2w.shape[0]}, "
                             f"got {tuple(self.intrinsics.shape)}")

    def __len__(self) -> int:
        return self.c2w.shape[0]

    def __getitem__(self, index: int | slice | Tensor) -> Cameras:
        if isinstance(index, int):
            index = slice(index, index + 1)
        viewmats = None if self.viewmats is None else self.viewmats[index]
        return Cameras(self.c2w[index], self.intrinsics[index], self.width, self.height, viewmats)

    def to(self, *args, **kwargs) -> Cameras:
        """Cameras on another device / dtype; copies from pinned memory do not wait for the GPU."""
        kwargs.setdefault("non_blocking", self.c2w.is_pinned())
        viewmats = None if self.viewmats is None else self.viewmats.to(*args, **kwargs)
        return Cameras(self.c2w.to(*args, **kwargs), self.intrinsics.to(*args, **kwargs), self.width, self.height, viewmats)

    def pin_memory(self) -> Cameras:
        """Cameras in page-locked memory (DataLoader(pin_memory=True) calls this): asynchronous uploads."""
        viewmats = None if self.viewmats is None else self.viewmats.pin_memory()
        return Cameras(self.c2w.pin_memory(), self.intrinsics.pin_memory(), self.width, self.height, viewmats)

    @property
    def device(self) -> torch.device:
        return self.c2w.device

    @property
    def positions(self) -> Tensor:
        """Camera centers [B, 3] in world space."""
        return self.c2w[:, :3, 3]

    def rays(self, normalized: bool = True) -> tuple[Tensor, Tensor]:
        """Ray origins and directions [B, H, W, 3] through every pixel center."""
        return camera_rays(self.c2w, self.intrinsics, self.width, self.height, normalized)

    def w2c_opencv(self) -> Tensor:
        """World-to-camera [B, 4, 4] in OpenCV axes (the precomputed ``viewmats`` when there are)."""
        return w2c_opencv(self.c2w) if self.viewmats is None else self.viewmats

    def resized(self, width: int, height: int) -> Cameras:
        """The same cameras rendering at another resolution (intrinsics scaled)."""
        scale = torch.tensor([width / self.width, height / self.height, 1.0], dtype=self.intrinsics.dtype, device=self.device)
        return Cameras(self.c2w, self.intrinsics * scale[:, None], width, height, self.viewmats)

    @staticmethod
    def cat(cameras: list[Cameras]) -> Cameras:
        """One batch from several of the same image size."""
        sizes = {(c.width, c.height) for c in cameras}
        if len(sizes) != 1:
            raise ValueError(f"cannot batch cameras of different image sizes {sorted(sizes)}")
        return Cameras(torch.cat([c.c2w for c in cameras]), torch.cat([c.intrinsics for c in cameras]), *sizes.pop())
