"""Test-only analytic shapes for the exporters: a sphere (and box) density, a color field and an exact
ray-traced renderer of the sphere (the system using them is in sphere_system.py)."""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.cameras import Cameras


def sphere_density(points: Tensor, radius: float, width: float = 0.02, peak: float = 50.0) -> Tensor:
    """A smooth ball: ``peak`` inside, 0 outside, exactly ``peak / 2`` on the sphere |x| = radius."""
    return peak * torch.sigmoid((radius - points.norm(dim=-1)) / width)


def box_density(points: Tensor, half: Tensor, width: float = 0.02, peak: float = 50.0) -> Tensor:
    """A smooth box |x_i| <= half_i: ``peak / 2`` exactly on its faces (away from edges and corners too
    the level set is the box, since the inner value is the distance to the nearest face)."""
    return peak * torch.sigmoid((half.to(points) - points.abs()).min(dim=-1).values / width)


def position_color(points: Tensor) -> Tensor:
    """A smooth color field: RGB = 0.5 + 0.5 * x (clamped), varying over any surface near the origin."""
    return (0.5 + 0.5 * points).clamp(0.0, 1.0)


def render_sphere(cameras: Cameras, radius: float, color_fn=position_color, background: float = 1.0) -> dict[str, Tensor]:
    """Exact renders of an opaque sphere at the origin: rgb (color field at the hit point over
    ``background``), alpha (1 on the sphere), depth (camera-space z of the hit, 0 elsewhere)."""
    origins, directions = cameras.rays(normalized=False)  # camera-space z of directions is -1: t is depth
    b = (origins * directions).sum(-1)
    a = (directions * directions).sum(-1)
    c = (origins * origins).sum(-1) - radius**2
    disc = b * b - a * c
    hit = disc > 0
    t = (-b - disc.clamp_min(0).sqrt()) / a
    points = origins + t[..., None] * directions
    color = color_fn(points.reshape(-1, 3)).reshape(points.shape)
    alpha = hit.float()[..., None]
    rgb = color * alpha + background * (1 - alpha)
    depth = torch.where(hit, t, torch.zeros_like(t))[..., None]
    return {"rgb": rgb, "alpha": alpha, "depth": depth}
