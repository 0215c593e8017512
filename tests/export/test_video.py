"""Turntable videos: orbit cameras, and .mp4/.gif files with the right frame count, size and content."""

import math

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from lift3d.cameras import c2w_to_spherical
from lift3d.export.video import orbit_cameras, render_frames, write_orbit_video
from lift3d.saving import OutputSaver
from tests.plugins.analytic_sphere import render_sphere


def test_orbit_cameras_circle_the_origin_at_fixed_elevation():
    cams = orbit_cameras(12, elevation_deg=20.0, distance=3.0, fovy_deg=40.0, width=48, height=32)
    elevation, azimuth, distance = c2w_to_spherical(cams.c2w)
    assert torch.allclose(elevation, torch.full((12,), math.radians(20.0)), atol=1e-5)
    assert torch.allclose(distance, torch.full((12,), 3.0), atol=1e-5)
    steps = torch.remainder(torch.diff(azimuth), 2 * math.pi)
    assert torch.allclose(steps, torch.full((11,), 2 * math.pi / 12), atol=1e-5)
    forward = -cams.c2w[:, :3, 2]  # OpenGL cameras look down -z
    assert torch.allclose(forward, -cams.positions / 3.0, atol=1e-5)
    assert (cams.width, cams.height) == (48, 32)


def _frame_number_render(cameras):
    """Frames whose brightness encodes the camera's azimuth (to check order), plus the sphere."""
    out = render_sphere(cameras, 0.5)
    azimuth = torch.remainder(torch.atan2(cameras.positions[:, 1], cameras.positions[:, 0]), 2 * math.pi)
    out["rgb"][:, :4] = (azimuth / (2 * math.pi))[:, None, None, None]  # a top band of uniform gray
    return out


def test_mp4_and_gif_have_the_frame_count_size_and_order(tmp_path):
    cams = orbit_cameras(10, 15.0, 2.5, 40.0, width=64, height=48)
    paths = write_orbit_video(OutputSaver(tmp_path), "orbit", _frame_number_render, cams, fps=10, formats=("mp4", "gif"),
                              batch_size=3)
    assert [p.name for p in paths] == ["orbit.mp4", "orbit.gif"]
    for path in paths:
        frames = iio.imread(path, index=None)
        assert frames.shape[:3] == (10, 48, 64), path.name
        band = frames[:, :4, :, :3].astype(float).mean(axis=(1, 2, 3)) / 255
        assert np.allclose(band, np.arange(10) / 10, atol=0.03), path.name  # in orbit order
        assert frames[0, 24, 32, :3].min() < 200  # the sphere is in the middle (the background is white)


def test_render_frames_checks_the_renderer_output():
    cams = orbit_cameras(2, 0.0, 2.0, 40.0, width=16, height=16)
    with pytest.raises(ValueError, match="expected"):
        render_frames(lambda c: {"rgb": torch.zeros(len(c), 8, 8, 3)}, cams)
    with pytest.raises(ValueError, match="mp4 or gif"):
        write_orbit_video(OutputSaver("unused"), "x", lambda c: render_sphere(c, 0.5), cams, formats=("avi",))


def _small_object_ply(path, center=(1.0, -0.5, 0.3), across=0.2, n=1500):
    """A red ball of opaque Gaussians ``across`` units wide, away from the origin, saved as a 3DGS .ply."""
    from lift3d.gaussians.formats.ply import save_ply
    from lift3d.sh import rgb_to_sh

    g = torch.Generator().manual_seed(0)
    direction = torch.randn(n, 3, generator=g)
    direction = direction / direction.norm(dim=1, keepdim=True)
    means = direction * (across / 2) * torch.rand(n, 1, generator=g) ** (1 / 3) + torch.tensor(center)
    save_ply(path, {"means": means, "log_scales": torch.full((n, 3), math.log(across / 40)),
                    "quats": torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1), "opacity_logits": torch.full((n,), 4.0),
                    "sh0": rgb_to_sh(torch.tensor([[0.8, 0.1, 0.1]])).repeat(n, 1)[:, None],
                    "shN": torch.zeros(n, 0, 3)})
    return path


def _filled(path) -> np.ndarray:
    """Share of each frame's pixels that differ from the background (the corner pixel's color)."""
    frames = iio.imread(path, index=None)[..., :3].astype(float)
    background = frames[:, :1, :1]
    return (np.abs(frames - background).max(axis=-1) > 40).mean(axis=(1, 2))


def test_an_orbit_video_frames_a_small_object_as_the_viewer_does(tmp_path):
    from lift3d.cli import main

    path = _small_object_ply(tmp_path / "small.ply")
    small = ["system.export.video_frames=6", "system.export.video_width=64", "system.export.video_height=48"]
    assert main(["export", str(path), "--format", "mp4", *small]) == 0
    filled = _filled(tmp_path / "small-ply-orbit.mp4")
    assert len(filled) == 6 and filled.min() >= 0.2, filled  # every frame: the object, not a speck
    assert filled.max() < 0.9  # whole, with a margin (not cut by the frame)
    # the fixed orbit of old (4 units from the origin) shows the same object as a speck, or not at all
    assert main(["export", str(path), "--format", "mp4", *small, "system.export.video_framing=fixed",
                 "system.export.stem=fixed"]) == 0
    assert _filled(tmp_path / "fixed-orbit.mp4").max() < 0.05


def test_framed_orbits_circle_the_content_center_at_the_viewer_rule():
    from lift3d.export.video import framed_orbit_cameras
    from lift3d.framing import VIEWER_FOVY_DEG, content_bounds, framing_camera, framing_distance

    points = torch.rand(5000, 3) * 0.2 + torch.tensor([2.0, 1.0, -1.0])  # a 0.2 cube centered at (2.1, 1.1, -0.9)
    bounds = content_bounds(points)
    assert np.allclose(bounds.center, (2.1, 1.1, -0.9), atol=0.01)
    assert framing_distance(bounds.radius, VIEWER_FOVY_DEG) == pytest.approx(2.4 * bounds.radius)  # the viewer's rule
    position, look = framing_camera(points, elevation_deg=0.0)
    assert np.allclose(look, bounds.center) and position[0] - look[0] == pytest.approx(2.4 * bounds.radius)
    cams = framed_orbit_cameras(points, 8, 20.0, 40.0, 64, 48, fill=0.9)
    offsets = cams.positions - torch.tensor(bounds.center)
    assert torch.allclose(offsets.norm(dim=-1), torch.full((8,), framing_distance(bounds.radius, 40.0, 0.9)), rtol=1e-5)
    forward = -cams.c2w[:, :3, 2]
    assert torch.allclose(forward, -offsets / offsets.norm(dim=-1, keepdim=True), atol=1e-5)  # every frame looks at it
    portrait = framed_orbit_cameras(points, 1, 20.0, 40.0, 48, 64, fill=0.9)  # the narrower width decides
    assert (portrait.positions - torch.tensor(bounds.center)).norm() > offsets[0].norm()
