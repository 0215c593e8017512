import math

import torch

from lift3d.cameras import (
    Cameras,
    c2w_to_spherical,
    camera_rays,
    focal_from_fov,
    fov_from_focal,
    intrinsics_from_fovy,
    look_at,
    opencv_to_opengl,
    opengl_to_opencv,
    orbit_c2w,
    perspective_projection,
    spherical_to_c2w,
    w2c_opencv,
)


def test_look_at_from_plus_x_hand_computed():
    c2w = look_at(torch.tensor([2.0, 0.0, 0.0]), torch.zeros(3), torch.tensor([0.0, 0.0, 1.0]))
    expected = torch.tensor([[0.0, 0.0, 1.0, 2.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    assert torch.allclose(c2w, expected, atol=1e-6)


def test_look_at_straight_down_is_finite_and_orthonormal():
    c2w = look_at(torch.tensor([0.0, 0.0, 3.0]), torch.zeros(3), torch.tensor([0.0, 0.0, 1.0]))
    R = c2w[:3, :3]
    assert torch.isfinite(c2w).all()
    assert torch.allclose(R.T @ R, torch.eye(3), atol=1e-6)
    assert torch.allclose(-R[:, 2], torch.tensor([0.0, 0.0, -1.0]), atol=1e-6)  # looks down


def test_spherical_round_trip_and_hand_case():
    c2w = spherical_to_c2w(torch.tensor([math.radians(30)]), torch.tensor([math.radians(90)]), torch.tensor([2.0]))
    # elevation 30, azimuth 90: position (0, 2 cos30, 2 sin30)
    assert torch.allclose(c2w[0, :3, 3], torch.tensor([0.0, 2 * math.cos(math.radians(30)), 1.0]), atol=1e-6)
    elevation, azimuth, distance = c2w_to_spherical(c2w)
    assert math.isclose(math.degrees(float(elevation)), 30.0, abs_tol=1e-4)
    assert math.isclose(math.degrees(float(azimuth)), 90.0, abs_tol=1e-4)
    assert math.isclose(float(distance), 2.0, abs_tol=1e-6)


def test_focal_and_fov():
    assert math.isclose(focal_from_fov(math.radians(90), 100), 50.0, rel_tol=1e-9)
    assert math.isclose(fov_from_focal(50.0, 100), math.radians(90), rel_tol=1e-9)
    K = intrinsics_from_fovy(torch.tensor([math.radians(90)]), 200, 100)
    assert torch.allclose(K[0], torch.tensor([[50.0, 0, 100], [0, 50.0, 50], [0, 0, 1]]))


def test_center_ray_points_along_view_and_corners_by_fov():
    c2w = look_at(torch.tensor([[2.0, 0.0, 0.0]]), torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 1.0]]))
    K = intrinsics_from_fovy(torch.tensor([math.radians(90)]), 2, 2)
    origins, directions = camera_rays(c2w, K, 2, 2, normalized=False)
    assert origins.shape == (1, 2, 2, 3) and torch.allclose(origins[0, 0, 0], torch.tensor([2.0, 0, 0]))
    # pixel (0, 0) is top-left: camera-space direction (-0.5, +0.5, -1) with focal 1 and center 1
    expected_cam = torch.tensor([-0.5, 0.5, -1.0])
    assert torch.allclose(directions[0, 0, 0], c2w[0, :3, :3] @ expected_cam, atol=1e-6)
    _, unit = camera_rays(c2w, K, 2, 2)
    assert torch.allclose(unit.norm(dim=-1), torch.ones(1, 2, 2))


def test_opengl_opencv_conversion():
    c2w = spherical_to_c2w(torch.tensor([0.3]), torch.tensor([1.1]), torch.tensor([2.5]))
    cv = opengl_to_opencv(c2w)
    assert torch.allclose(opencv_to_opengl(cv), c2w)
    # OpenCV camera looks down +z: the target (origin) has positive camera-space z and projects to the center
    w2c = w2c_opencv(c2w)
    p = w2c[0] @ torch.tensor([0.0, 0.0, 0.0, 1.0])
    assert p[2] > 0 and torch.allclose(p[:2], torch.zeros(2), atol=1e-5)
    assert math.isclose(float(p[2]), 2.5, rel_tol=1e-5)


def test_projection_matches_pinhole():
    K = intrinsics_from_fovy(torch.tensor([math.radians(60)]), 64, 48)
    P = perspective_projection(K, 64, 48, 0.1, 10.0)
    point_cam = torch.tensor([0.3, -0.2, -2.0, 1.0])  # OpenGL camera space
    clip = P[0] @ point_cam
    ndc = clip[:3] / clip[3]
    u = (ndc[0] + 1) / 2 * 64
    v = (1 - ndc[1]) / 2 * 48
    # pinhole: u = fx * x / -z + cx, v = -fy * y / -z + cy
    assert math.isclose(float(u), float(K[0, 0, 0] * 0.3 / 2 + 32), rel_tol=1e-5)
    assert math.isclose(float(v), float(-K[0, 1, 1] * -0.2 / 2 + 24), rel_tol=1e-5)
    assert -1 < float(ndc[2]) < 1


def test_orbit_and_cameras_batch():
    c2w = orbit_c2w(8, 20.0, 3.0)
    elevation, azimuth, distance = c2w_to_spherical(c2w)
    assert torch.allclose(torch.rad2deg(elevation), torch.full((8,), 20.0), atol=1e-4)
    assert torch.allclose(distance, torch.full((8,), 3.0))
    cams = Cameras(c2w, intrinsics_from_fovy(torch.full((8,), 0.8), 32, 16), 32, 16)
    assert len(cams[2:5]) == 3 and len(cams[0]) == 1
    half = cams.resized(16, 8)
    assert torch.allclose(half.intrinsics[:, 0, 2], torch.full((8,), 8.0))
    origins, directions = half.rays()
    assert directions.shape == (8, 8, 16, 3)


def test_invert_affine_equals_the_matrix_inverse():
    from lift3d.cameras import invert_affine

    torch.manual_seed(3)
    q, _ = torch.linalg.qr(torch.randn(5, 3, 3, dtype=torch.float64))
    m = torch.eye(4, dtype=torch.float64).repeat(5, 1, 1)
    m[:, :3, :3] = q * torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)  # rotations, reflections, non-uniform scale
    m[:, :3, 3] = torch.randn(5, 3, dtype=torch.float64) * 4
    assert torch.allclose(invert_affine(m), torch.linalg.inv(m), atol=1e-12)
    assert torch.allclose(invert_affine(m.float()), torch.linalg.inv(m).float(), atol=1e-5)
    assert invert_affine(m[0]).shape == (4, 4)
