"""EWA projection: pinhole centers, 2D covariances against a numerical Jacobian, culling, bounding boxes."""

import numpy as np
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.render.splats.project import (
    ALPHA_THRESHOLD,
    covariance_3d,
    extent_for_opacity,
    project_gaussians,
)
from lift3d.rotations import quaternion_to_matrix
from tests.splat_reference import project_one

W, H = 40, 30


def _camera(eye=(0.5, -4.0, 1.0), dtype=torch.float64) -> Cameras:
    c2w = look_at(torch.tensor([eye]), torch.zeros(1, 3), torch.tensor([0.0, 0.0, 1.0])).to(dtype)
    return Cameras(c2w, intrinsics_from_fovy(torch.tensor([0.7]), W, H).to(dtype), W, H)


def _project(means, quats, scales, opacities, cam, **kw):
    return project_gaussians(means, covariance_3d(quats, scales), opacities, cam.w2c_opencv(), cam.intrinsics, W, H, **kw)


def test_rotation_matrices_are_rotations_of_any_norm_quaternion():
    R = quaternion_to_matrix(3.0 * torch.randn(20, 4, dtype=torch.float64))
    assert torch.allclose(R @ R.transpose(-1, -2), torch.eye(3, dtype=R.dtype).expand(20, 3, 3), atol=1e-12)
    assert torch.allclose(torch.linalg.det(R), torch.ones(20, dtype=R.dtype))
    assert torch.allclose(quaternion_to_matrix(torch.tensor([[2.0, 0, 0, 0]])), torch.eye(3)[None])


def test_centers_follow_the_opengl_camera_axes():
    cam = _camera()
    c2w = cam.c2w[0]
    center, right, up = c2w[:3, 3], c2w[:3, 0], c2w[:3, 1]
    forward = -c2w[:3, 2]
    points = torch.stack([center + 3 * forward, center + 3 * forward + 0.2 * right, center + 3 * forward + 0.2 * up])
    proj = _project(points, torch.tensor([[1.0, 0, 0, 0]] * 3, dtype=torch.float64),
                    torch.full((3, 3), 0.01, dtype=torch.float64),
                    torch.full((3,), 0.5, dtype=torch.float64), cam)
    m = proj.means2d[0]
    K = cam.intrinsics[0]
    assert torch.allclose(m[0], K[:2, 2])  # straight ahead: the principal point
    assert m[1, 0] > m[0, 0] and torch.isclose(m[1, 1], m[0, 1])  # camera right: larger column
    assert m[2, 1] < m[0, 1] and torch.isclose(m[2, 0], m[0, 0])  # camera up: smaller row (image y down)
    assert torch.allclose(proj.depths[0], torch.full((3,), 3.0, dtype=torch.float64))
    assert torch.isclose(m[1, 0] - m[0, 0], K[0, 0] * 0.2 / 3)


def test_2d_covariance_is_the_jacobian_sandwich_plus_the_dilation():
    torch.manual_seed(0)
    cam = _camera()
    n = 10
    means = 0.4 * torch.randn(n, 3, dtype=torch.float64)
    quats = torch.randn(n, 4, dtype=torch.float64)
    scales = 0.05 + 0.2 * torch.rand(n, 3, dtype=torch.float64)
    proj = _project(means, quats, scales, torch.full((n,), 0.9, dtype=torch.float64), cam)
    w2c, K = cam.w2c_opencv()[0], cam.intrinsics[0]

    def pixel(x):  # the pinhole map, world point -> pixel
        c = w2c[:3, :3] @ x + w2c[:3, 3]
        return (K @ c)[:2] / c[2]

    for i in range(n):
        J = torch.autograd.functional.jacobian(pixel, means[i])  # [2, 3], by autograd of the plain map
        cov2d = J @ covariance_3d(quats[i : i + 1], scales[i : i + 1])[0] @ J.T + 0.3 * torch.eye(2, dtype=J.dtype)
        a, b, c = proj.conics[0, i]
        assert torch.allclose(torch.tensor([[a, b], [b, c]]), torch.linalg.inv(cov2d), rtol=1e-10)
        assert torch.allclose(proj.means2d[0, i], pixel(means[i]))


def test_jacobian_is_clamped_outside_1_3x_the_field_of_view():
    cam = _camera()
    w2c, K = cam.w2c_opencv()[0], cam.intrinsics[0]
    c2w = cam.c2w[0]
    # in front of the camera but far to the side: its center projects outside the image
    point = c2w[:3, 3] - 2.0 * c2w[:3, 2] + 1.7 * c2w[:3, 0]
    quat, scale = torch.tensor([0.9, 0.1, 0.3, -0.2], dtype=torch.float64), torch.tensor([0.4, 0.6, 0.5], dtype=torch.float64)
    proj = _project(point[None], quat[None], scale[None], torch.tensor([0.9], dtype=torch.float64), cam)
    mean2d, cov2d, _ = project_one(point.numpy(), quat.numpy(), scale.numpy(), w2c.numpy(), K.numpy(), W, H)
    assert mean2d[0] > W * 1.3  # outside 1.3x the field of view: the clamp is active
    a, b, c = proj.conics[0, 0].tolist()
    np.testing.assert_allclose(np.array([[a, b], [b, c]]), np.linalg.inv(cov2d), rtol=1e-10)


def test_culling_rules():
    cam = _camera()
    c2w = cam.c2w[0]
    center, forward, right = c2w[:3, 3], -c2w[:3, 2], c2w[:3, 0]
    means = torch.stack([
        center + 3 * forward,  # visible
        center - 1 * forward,  # behind the camera
        center + 0.005 * forward,  # closer than the near plane
        center + 3 * forward + 10 * right,  # far outside the image
        center + 3 * forward,  # too transparent
    ])  # fmt: skip
    n = len(means)
    opacities = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.9 * ALPHA_THRESHOLD], dtype=torch.float64)
    proj = _project(means, torch.tensor([[1.0, 0, 0, 0]] * n, dtype=torch.float64), torch.full((n, 3), 0.05, dtype=torch.float64),
                    opacities, cam)
    assert proj.visible[0].tolist() == [True, False, False, False, False]
    assert (proj.radii[0, 1:] == 0).all() and (proj.radii[0, 0] > 0).all()
    far = _project(means[:1], torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64), torch.full((1, 3), 0.05, dtype=torch.float64),
                   opacities[:1], cam, far_plane=2.0)
    assert not far.visible.any()


def test_bounding_boxes_hold_every_pixel_above_the_alpha_threshold():
    torch.manual_seed(1)
    cam = _camera()
    n = 40
    means = 0.6 * torch.randn(n, 3, dtype=torch.float64)
    quats = torch.randn(n, 4, dtype=torch.float64)
    scales = 0.02 + 0.3 * torch.rand(n, 3, dtype=torch.float64)
    opacities = torch.rand(n, dtype=torch.float64)
    proj = _project(means, quats, scales, opacities, cam)
    rows, cols = torch.meshgrid(torch.arange(H, dtype=torch.float64) + 0.5, torch.arange(W, dtype=torch.float64) + 0.5,
                                indexing="ij")
    for i in range(n):
        a, b, c = proj.conics[0, i]
        dx, dy = cols - proj.means2d[0, i, 0], rows - proj.means2d[0, i, 1]
        alpha = opacities[i] * torch.exp(-(0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy))
        covered = alpha >= ALPHA_THRESHOLD
        if not proj.visible[0, i]:
            assert not covered.any(), i
            continue
        rx, ry = proj.radii[0, i].tolist()
        assert (dx[covered].abs() <= rx).all() and (dy[covered].abs() <= ry).all(), i
        # tight: within one pixel of the analytic half-extent of the 1/255 ellipse
        cov = torch.linalg.inv(torch.tensor([[a, b], [b, c]]))
        assert rx - 1 < extent_for_opacity(float(opacities[i])) * cov[0, 0].sqrt() <= rx
