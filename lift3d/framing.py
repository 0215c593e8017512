"""Framing content: where a camera stands to see a set of points whole (the viewer's home view, turntable videos).

One rule for every consumer: the content is the 2-98 percentile box of its points (so stray floaters do not count),
its bounding sphere is the box's center and half-diagonal, and a camera with vertical field of view ``fovy`` stands
where that sphere's silhouette spans ``fill`` of the frame's half-height. The viewer uses ``VIEWER_FILL`` (2.4
half-diagonals away at its 75-degree field of view); turntables frame tighter (``system.export.video_fill``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

VIEWER_FOVY_DEG = 75.0  # viser's default vertical field of view, which the viewer's page starts with
VIEWER_DISTANCE = 2.4  # the viewer stands this many half-diagonals of the content's box away (at VIEWER_FOVY_DEG)
VIEWER_FILL = math.tan(math.asin(1.0 / VIEWER_DISTANCE)) / math.tan(math.radians(VIEWER_FOVY_DEG) / 2)
MAX_SAMPLE = 100_000  # points the percentiles are taken over (a fixed random subset of larger sets)


@dataclass(frozen=True)
class Bounds:
    """The content's bounding sphere: the center and half-diagonal of the 2-98 percentile box of its points."""

    center: tuple[float, float, float]
    radius: float


def content_box(points: Tensor) -> tuple[Tensor, Tensor]:
    """(low [3], high [3]): the 2-98 percentile box of ``points`` [N, 3] (N >= 1), where the content is; stray points
    (a scene's far background, floaters) do not count."""
    points = torch.as_tensor(points).detach().reshape(-1, 3).float().cpu()
    if len(points) == 0:
        raise ValueError("there are no points to frame")
    sample = points[torch.randperm(len(points), generator=torch.Generator().manual_seed(0))[:MAX_SAMPLE]]
    return torch.quantile(sample, 0.02, dim=0), torch.quantile(sample, 0.98, dim=0)


def content_bounds(points: Tensor) -> Bounds:
    """The bounds of ``points`` [N, 3] (N >= 1): the center and half-diagonal of their ``content_box``; a radius under
    1e-3 is raised to it, so one point still frames."""
    low, high = content_box(points)
    center = (low + high) / 2
    return Bounds(tuple(center.tolist()), max(float((high - low).norm()) / 2, 1e-3))


def framing_distance(radius: float, fovy_deg: float, fill: float = VIEWER_FILL) -> float:
    """Distance from the center at which a sphere of ``radius`` spans ``fill`` (0..1] of the frame's half-height
    seen with vertical field of view ``fovy_deg``."""
    if not 0.0 < fill <= 1.0 or not 0.0 < fovy_deg < 180.0:
        raise ValueError(f"framing needs 0 < fill <= 1 and 0 < fovy < 180 degrees, got fill {fill} and fovy {fovy_deg}")
    half_angle = math.atan(fill * math.tan(math.radians(fovy_deg) / 2))  # the sphere's silhouette, seen from the camera
    return radius / math.sin(half_angle)


def framing_camera(points: Tensor, elevation_deg: float = 25.0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(position, look-at) of the viewer's camera that sees ``points`` [N, 3] whole: it looks at the center of their
    bounds from ``framing_distance`` at the viewer's field of view (2.4 half-diagonals), ``elevation_deg`` above it
    (+z up), along +x."""
    bounds = content_bounds(points)
    distance = framing_distance(bounds.radius, VIEWER_FOVY_DEG, VIEWER_FILL)
    e = math.radians(elevation_deg)
    center = bounds.center
    position = (center[0] + distance * math.cos(e), center[1], center[2] + distance * math.sin(e))
    return position, tuple(center)
