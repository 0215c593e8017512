"""The viewer's pure math against hand-computed cases: viser pose <-> lift3d c2w, intrinsics from viser's fov,
quaternions, slerp, Catmull-Rom, path interpolation and timing, normals from depth, the render schedule and budget."""

import math

import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy
from lift3d.config import ConfigError
from lift3d.rotations import matrix_to_quaternion, quaternion_to_matrix
from lift3d.viewer.camera_math import (
    c2w_to_viser_pose,
    catmull_rom,
    interpolate_path,
    normals_from_depth,
    render_size,
    slerp,
    viewer_cameras,
    viser_pose_to_c2w,
)
from lift3d.viewer.path import CameraPath, Keyframe, load_camera_path, parse_camera_path, path_cameras, save_camera_path
from lift3d.viewer.server import next_render
from lift3d.viewer.training import RenderBudget

S = math.sqrt(0.5)


def test_identity_viser_pose_is_an_opengl_camera_looking_along_world_z():
    c2w = viser_pose_to_c2w([1, 0, 0, 0], [1, 2, 3])
    # viser (OpenCV): looks along +z, image up is -y. lift3d (OpenGL): looks down its -z column, up is its +y column
    expected = torch.tensor([[1, 0, 0, 1], [0, -1, 0, 2], [0, 0, -1, 3], [0, 0, 0, 1]], dtype=torch.float64)
    assert torch.allclose(c2w, expected)


def test_quarter_turn_about_x():
    # wxyz (cos 45, sin 45, 0, 0): R = [[1,0,0],[0,0,-1],[0,1,0]]; OpenCV look = R[:,2] = (0,-1,0), OpenCV up = -R[:,1]
    c2w = viser_pose_to_c2w([S, S, 0, 0], [0, 0, 0])
    look, up = -c2w[:3, 2], c2w[:3, 1]
    assert torch.allclose(look, torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(up, torch.tensor([0.0, 0.0, -1.0], dtype=torch.float64), atol=1e-12)


def test_pose_round_trip_and_quaternion_sign():
    for wxyz in ([1, 0, 0, 0], [S, S, 0, 0], [0.5, 0.5, -0.5, 0.5], [0.0, 0.0, 1.0, 0.0], [0.1, -0.7, 0.2, 0.68]):
        q = torch.tensor(wxyz, dtype=torch.float64)
        q = q / q.norm()
        c2w = viser_pose_to_c2w(q, [0.5, -1.0, 2.0])
        back, position = c2w_to_viser_pose(c2w)
        assert torch.allclose(back, q if q[0] >= 0 else -q, atol=1e-9)
        assert torch.allclose(position, torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64))
    # 180 degrees about z: the matrix diag(-1, -1, 1), the quaternion (0, 0, 0, 1)
    half_turn = torch.diag(torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64))
    assert torch.allclose(quaternion_to_matrix(torch.tensor([0, 0, 0, 1.0], dtype=torch.float64)), half_turn)
    assert torch.allclose(matrix_to_quaternion(half_turn).abs(),
                          torch.tensor([0, 0, 0, 1.0], dtype=torch.float64))


def test_intrinsics_from_viser_vertical_fov():
    cams = viewer_cameras(torch.eye(4), math.radians(90), 200, 100)
    # fy = (100 / 2) / tan(45 deg) = 50, square pixels, principal point in the middle
    assert torch.allclose(cams.intrinsics[0], torch.tensor([[50.0, 0, 100], [0, 50, 50], [0, 0, 1]]))
    assert (cams.width, cams.height) == (200, 100)


def test_render_size_keeps_the_canvas_aspect():
    assert render_size(1280, 720, 256) == (256, 144)
    assert render_size(500, 1000, 100) == (50, 100)
    assert render_size(0, 0, 64) == (64, 64)


def test_slerp_halfway_between_identity_and_a_quarter_turn():
    q1 = torch.tensor([S, 0, 0, S], dtype=torch.float64)  # 90 degrees about z
    half = slerp(torch.tensor([1.0, 0, 0, 0]), q1, 0.5)
    assert torch.allclose(half, torch.tensor([math.cos(math.pi / 8), 0, 0, math.sin(math.pi / 8)], dtype=torch.float64))
    # -q1 is the same rotation: slerp takes the short way and lands on the same halfway rotation
    assert torch.allclose(quaternion_to_matrix(slerp(torch.tensor([1.0, 0, 0, 0]), -q1, 0.5)), quaternion_to_matrix(half))


def test_catmull_rom_hand_values():
    p = [torch.tensor([v], dtype=torch.float64) for v in (0.0, 1.0, 0.0, 3.0)]
    # 0.5 * (2*1 + 0*0.5 + (0 - 5 + 0 - 3)*0.25 + (3 - 0 - 0 + 3)*0.125) = 0.375
    assert float(catmull_rom(*p, 0.5)) == pytest.approx(0.375)
    assert float(catmull_rom(*p, 0.0)) == pytest.approx(1.0) and float(catmull_rom(*p, 1.0)) == pytest.approx(0.0)


def _keyframes(positions, yaw_deg):
    c2w = torch.zeros(len(positions), 4, 4, dtype=torch.float64)
    for i, (pos, yaw) in enumerate(zip(positions, yaw_deg)):
        half = math.radians(yaw) / 2
        c2w[i, :3, :3] = quaternion_to_matrix(torch.tensor([math.cos(half), 0, 0, math.sin(half)], dtype=torch.float64))
        c2w[i, :3, 3] = torch.tensor(pos, dtype=torch.float64)
        c2w[i, 3, 3] = 1
    return c2w


def test_two_keyframe_path_is_linear_in_position_and_slerped_in_rotation():
    c2w = _keyframes([(0, 0, 0), (4, 0, 2)], [0, 90])
    fovy = torch.tensor([0.5, 1.0], dtype=torch.float64)
    frames, fovs = interpolate_path(c2w, fovy, 5, "spline")  # two keyframes: a spline is a straight line
    assert frames.shape == (5, 4, 4)
    assert torch.allclose(frames[0], c2w[0]) and torch.allclose(frames[-1], c2w[1])
    assert torch.allclose(frames[2, :3, 3], torch.tensor([2.0, 0, 1], dtype=torch.float64))
    yaw = math.degrees(math.atan2(float(frames[1, 1, 0]), float(frames[1, 0, 0])))
    assert yaw == pytest.approx(22.5)  # a quarter of the way through 90 degrees
    assert torch.allclose(fovs, torch.tensor([0.5, 0.625, 0.75, 0.875, 1.0], dtype=torch.float64))


def test_spline_path_passes_through_every_keyframe_and_bends_between():
    c2w = _keyframes([(0, 0, 0), (1, 1, 0), (2, 0, 0)], [0, 0, 0])
    frames, _ = interpolate_path(c2w, torch.ones(3), 5, "spline")
    linear, _ = interpolate_path(c2w, torch.ones(3), 5, "linear")
    for frame, key in ((0, 0), (2, 1), (4, 2)):
        assert torch.allclose(frames[frame, :3, 3], c2w[key, :3, 3])
    assert torch.allclose(linear[1, :3, 3], torch.tensor([0.5, 0.5, 0], dtype=torch.float64))
    # mirrored end neighbor P0' = 2*P0 - P1 = (-1,-1,0): y = 0.5*(2*0 + (1+1)*0.5 + (-2-0+4-0)*0.25 + (1+0-3+0)*0.125) = 0.625
    assert float(frames[1, 1, 3]) == pytest.approx(0.625)


def test_camera_path_frame_count_and_json_round_trip(tmp_path):
    keys = [Keyframe(torch.eye(4).tolist(), 40.0), Keyframe(_keyframes([(0, 0, 1)], [30])[0].tolist(), 60.0)]
    assert CameraPath(keys, fps=10, seconds=1.5).frame_count() == 15
    assert CameraPath(keys, fps=10, seconds=1.5, frames=7).frame_count() == 7
    path = save_camera_path(tmp_path / "p.json", CameraPath(keys, fps=12, seconds=0.5, width=32, height=24))
    loaded = load_camera_path(path)
    assert loaded.frame_count() == 6 and len(loaded.keyframes) == 2
    cams = path_cameras(loaded)
    assert len(cams) == 6 and (cams.width, cams.height) == (32, 24)
    assert torch.allclose(cams.intrinsics[0], intrinsics_from_fovy(torch.tensor([math.radians(40.0)]), 32, 24)[0])
    assert torch.allclose(cams.c2w[-1], torch.tensor(keys[1].c2w, dtype=torch.float32), atol=1e-6)


@pytest.mark.parametrize("record, message", [
    ({"keyframes": []}, "no keyframes"),
    ({"keyframes": [{"c2w": [[1, 0], [0, 1]]}]}, "4x4"),
    ({"keyframes": [{"c2w": torch.eye(4).tolist()}], "fps": -3}, "'fps' must be a positive number"),
    ({"keyframes": [{"c2w": torch.eye(4).tolist()}], "frames": 2.5}, "whole number"),
    ({"keyframes": [{"c2w": torch.eye(4).tolist()}], "interpolation": "cubic"}, "spline or linear"),
])
def test_malformed_camera_paths_are_config_errors(record, message):
    with pytest.raises(ConfigError, match=message):
        parse_camera_path(record)


def test_normals_from_depth_of_a_plane_facing_the_camera():
    c2w = viser_pose_to_c2w([S, S, 0, 0], [0, 0, 0]).float()  # an arbitrary rotation
    cams = Cameras(c2w[None], intrinsics_from_fovy(torch.tensor([1.0]), 8, 6), 8, 6)
    normals = normals_from_depth(torch.full((1, 6, 8, 1), 2.0), cams)
    # the plane z = -2 (camera space) faces the camera: its normal is camera +z, i.e. the c2w's third column
    assert torch.allclose(normals, c2w[:3, 2].expand(1, 6, 8, 3), atol=1e-5)


def test_render_schedule_preview_while_moving_full_when_still_and_refresh():
    args = dict(settle_seconds=0.2, refresh_seconds=0.0)
    assert next_render(10.05, 10.0, 3, 2, 2, 0.0, **args) == "preview"
    assert next_render(10.05, 10.0, 3, 3, 2, 0.0, **args) is None  # this camera already has its preview
    assert next_render(10.25, 10.0, 3, 3, 2, 0.0, **args) == "full"
    assert next_render(99.0, 10.0, 3, 3, 3, 10.3, **args) is None  # up to date, no refresh for a static model
    assert next_render(12.0, 10.0, 3, 3, 3, 10.3, settle_seconds=0.2, refresh_seconds=1.0) == "full"  # training: refresh


def test_render_budget_keeps_renders_to_their_share():
    budget = RenderBudget(0.1, start=100.0)
    assert budget.allows(100.0)
    budget.spend(1.0)
    assert not budget.allows(105.0) and budget.allows(110.0)  # 1 s of rendering needs 10 s of training
    budget.exclude(20.0)  # paused time is no training time
    assert not budget.allows(125.0) and budget.allows(130.0)
    assert not RenderBudget(0.0, start=0.0).allows(1e9)


def test_framing_camera_looks_at_the_points_from_outside_them():
    from lift3d.viewer.models import framing_camera

    points = torch.rand(2000, 3) * torch.tensor([2.0, 2.0, 2.0]) + torch.tensor([10.0, -4.0, 1.0])  # box centered at (11, -3, 2)
    position, look = framing_camera(points, elevation_deg=0.0)
    assert torch.allclose(torch.tensor(look), torch.tensor([11.0, -3.0, 2.0]), atol=0.1)
    # half-diagonal of the 2-98% box ~ 0.96 * sqrt(3); the camera is 2.4 of those along +x at elevation 0
    assert torch.allclose(torch.tensor(position), torch.tensor([11.0 + 2.4 * 0.96 * math.sqrt(3), -3.0, 2.0]), atol=0.15)
