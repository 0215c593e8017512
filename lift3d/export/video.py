"""Turntable videos: render a full orbit around the object and write it with ``OutputSaver.video``
(.mp4 through imageio-ffmpeg, .gif through imageio/Pillow)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.export.backproject import RenderFn
from lift3d.export.config import MAX_VIDEO_SIDE
from lift3d.framing import content_bounds, framing_distance
from lift3d.imaging import to_numpy_image
from lift3d.progress import Stage
from lift3d.saving import OutputSaver


def check_video_size(width: int, height: int, width_key: str, height_key: str, fixes: tuple[str, str] | None = None) -> None:
    """Refuse frames of under 2 or over MAX_VIDEO_SIDE pixels a side (each frame is rendered in memory whole), naming
    what set them (``*_key``) and how to set them (``fixes``; default ``KEY=1920`` and ``KEY=1080``)."""
    from lift3d.config import ConfigError

    fixes = fixes or (f"{width_key}=1920", f"{height_key}=1080")
    for key, value, fix in ((width_key, width, fixes[0]), (height_key, height, fixes[1])):
        if not 2 <= value <= MAX_VIDEO_SIDE:
            raise ConfigError(f"{key} must be 2..{MAX_VIDEO_SIDE} pixels (a video frame is rendered whole), got {value}: "
                              f"e.g. {fix}")


def orbit_cameras(
    n_frames: int, elevation_deg: float, distance: float, fovy_deg: float, width: int, height: int,
    start_azimuth_deg: float = 0.0, device: torch.device | str = "cpu", target: tuple[float, float, float] | None = None,
) -> Cameras:
    """``n_frames`` cameras evenly spaced around a full turn, looking at ``target`` (default the origin; +z up)."""
    if n_frames < 1:
        raise ValueError(f"an orbit needs at least one frame, got {n_frames}")
    c2w = orbit_c2w(n_frames, elevation_deg, distance, start_azimuth_deg)
    if target is not None:  # the same orbit, moved to circle the target
        c2w[:, :3, 3] += torch.tensor(target, dtype=c2w.dtype)
    intrinsics = intrinsics_from_fovy(torch.full((n_frames,), math.radians(fovy_deg)), width, height)
    return Cameras(c2w, intrinsics, width, height).to(device)


def framed_orbit_cameras(
    points: torch.Tensor, n_frames: int, elevation_deg: float, fovy_deg: float, width: int, height: int,
    fill: float = 0.9, start_azimuth_deg: float = 0.0, device: torch.device | str = "cpu",
) -> Cameras:
    """An orbit that frames ``points`` [N, 3] as the viewer does (``lift3d.framing``): around the center of their
    bounds, at the distance where the bounds span ``fill`` of the frame's height (or width, in a portrait frame)."""
    bounds = content_bounds(points)
    fov_deg = min(fovy_deg, math.degrees(2 * math.atan(math.tan(math.radians(fovy_deg) / 2) * width / height)))
    distance = framing_distance(bounds.radius, fov_deg, fill)
    return orbit_cameras(n_frames, elevation_deg, distance, fovy_deg, width, height, start_azimuth_deg, device,
                         target=bounds.center)


@torch.no_grad()
def render_frames(render_fn: RenderFn, cameras: Cameras, batch_size: int = 4) -> list[np.ndarray]:
    """uint8 RGB frames [H, W, 3] of ``render_fn`` (cameras -> {"rgb": [B, H, W, 3], ...}) per camera."""
    frames: list[np.ndarray] = []
    with Stage(f"video: rendering {cameras.width} x {cameras.height}", len(cameras), "frames") as stage:
        for start in range(0, len(cameras), batch_size):
            rgb = render_fn(cameras[start : start + batch_size])["rgb"]
            if rgb.ndim != 4 or rgb.shape[1:3] != (cameras.height, cameras.width):
                raise ValueError(f"render_fn returned rgb of shape {tuple(rgb.shape)}; "
                                 f"expected [B, {cameras.height}, {cameras.width}, 3]")
            frames.extend(to_numpy_image(frame[..., :3].clamp(0, 1)) for frame in rgb)
            stage.advance(len(rgb))
    return frames


def write_orbit_video(
    saver: OutputSaver, stem: str, render_fn: RenderFn, cameras: Cameras, fps: int = 30,
    formats: tuple[str, ...] = ("mp4",), batch_size: int = 4,
) -> list[Path]:
    """Render ``cameras`` once and write ``<stem>.<fmt>`` for each of ``formats`` (mp4, gif)."""
    unknown = sorted(set(formats) - {"mp4", "gif"})
    if unknown:
        raise ValueError(f"unknown video format(s) {unknown}: use mp4 or gif")
    frames = render_frames(render_fn, cameras, batch_size)
    return [saver.video(f"{stem}.{fmt}", frames, fps=fps) for fmt in formats]
