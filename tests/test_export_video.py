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
    out["rgb"][:, :4] = (azimuth / (2 * math.pi))[:, None, None, None]  # a top band of uniform grey
    return out


def test_mp4_and_gif_have_the_frame_count_size_and_order(tmp_path):
    cams = orbit_cameras(10, 15.0, 2.5, 40.0, width=64, height=48)
    paths = write_orbit_video(OutputSaver(tmp_path), "orbit", _frame_number_render, cams, fps=10, formats=("mp4", "gif"), batch_size=3)
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
