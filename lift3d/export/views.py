"""The cameras of exports: turntable orbits and the views colors are back-projected from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lift3d.export.config import ExportConfig, for_device
from lift3d.export.video import framed_orbit_cameras, orbit_cameras


def turntable_cameras(cfg: ExportConfig, content_points: Callable[[], torch.Tensor] | None, n_frames: int,
                      elevation_deg: float, start_azimuth_deg: float = 0.0, device: torch.device | str = "cpu") -> Any:
    """An orbit of ``n_frames`` cameras as the config frames it: around the content's center at the distance its bounds
    need (``video_framing=content``, when the sources give content points; ``lift3d.framing``, the viewer's rule), else
    at ``video_distance`` around the origin."""
    cfg = for_device(cfg, device)
    if cfg.video_framing == "content" and content_points is not None:
        return framed_orbit_cameras(content_points(), n_frames, elevation_deg, cfg.video_fovy_deg, cfg.video_width,
                                    cfg.video_height, cfg.video_fill, start_azimuth_deg, device=device)
    return orbit_cameras(n_frames, elevation_deg, cfg.video_distance, cfg.video_fovy_deg, cfg.video_width,
                         cfg.video_height, start_azimuth_deg=start_azimuth_deg, device=device)


def framing_points(content_points: Callable[[], torch.Tensor] | None,
                   mesh: Callable[[], Any] | None = None) -> Callable[[], torch.Tensor] | None:
    """What frames a source's turntable: its own content points, else the vertices of its mesh (a mesh run's mesh, or
    the one the export builds anyway), so every source with either orbits its content; None when it has neither."""
    if content_points is not None or mesh is None:
        return content_points
    return lambda: torch.as_tensor(np.asarray(mesh().vertices), dtype=torch.float32)


def backproject_cameras(cfg: ExportConfig, device: torch.device | str = "cpu",
                        content_points: Callable[[], torch.Tensor] | None = None) -> Any:
    """Views for color back-projection: two rings around the object (elevations +30 and -15 degrees), framed as the
    turntable is (``turntable_cameras``)."""
    from lift3d.cameras import Cameras

    half = max(1, cfg.backproject_views // 2)
    rings = [turntable_cameras(cfg, content_points, half, elevation, offset, device)
             for elevation, offset in ((30.0, 0.0), (-15.0, 180.0 / half))]
    return Cameras.cat(rings)
