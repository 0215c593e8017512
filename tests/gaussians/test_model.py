"""The Gaussian model: activations, initialization (sphere, mask carving, point cloud, mesh), SH schedule,
resizing for checkpoints."""

import math

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

from lift3d.data.posed_images import read_transforms
from lift3d.data.sample_scene import sample_scene_path
from lift3d.gaussians import init
from lift3d.gaussians.model import GaussianModel
from lift3d.sh import sh_to_rgb


def test_initialize_sets_the_3dgs_starting_values():
    points = torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [0, 2.0, 0], [0, 0, 3.0], [5.0, 5.0, 5.0]])
    colors = torch.rand(5, 3)
    model = GaussianModel({"sh_degree": 2, "init_opacity": 0.1})
    model.initialize(points, colors)
    assert len(model) == 5 and model.sh.shape == (5, 9, 3)
    assert torch.allclose(model.opacities, torch.full((5,), 0.1))
    assert torch.equal(model.quats, torch.tensor([[1.0, 0, 0, 0]]).expand(5, 4))
    assert torch.allclose(sh_to_rgb(model.sh0[:, 0]), colors, atol=1e-6) and not model.shN.any()
    # size: root mean squared distance to the 3 nearest other points, by brute force
    d2 = torch.cdist(points, points) ** 2
    d2.fill_diagonal_(float("inf"))
    expected = d2.topk(3, largest=False).values.mean(-1).sqrt()
    assert torch.allclose(model.scales, expected[:, None].expand(5, 3), rtol=1e-5)


def test_sh_degree_rises_on_schedule():
    model = GaussianModel({"sh_degree": 3, "sh_degree_interval": 100})
    degrees = []
    for step in (0, 99, 100, 250, 300, 10_000):
        model.update_step(0, step)
        degrees.append(model.active_sh_degree)
    assert degrees == [0, 0, 1, 2, 3, 3]
    assert GaussianModel({"sh_degree": 2, "sh_degree_interval": 0}).active_sh_degree == 2


def test_resize_to_a_checkpoint_then_load():
    small, big = GaussianModel({"sh_degree": 1}), GaussianModel({"sh_degree": 1})
    small.initialize(torch.randn(4, 3))
    big.initialize(torch.randn(9, 3))
    state = {f"gaussians.{k}": v for k, v in big.state_dict().items()}
    small.resize_to_state_dict(state, prefix="gaussians.")
    small.load_state_dict(big.state_dict())
    assert len(small) == 9 and torch.equal(small.means, big.means)


def test_random_points_fill_the_ball():
    points = init.random_in_sphere(20000, 2.0, torch.Generator().manual_seed(0))
    r = points.norm(dim=-1)
    assert r.max() <= 2.0 and abs(float((r / 2.0).pow(3).mean()) - 0.5) < 0.02  # uniform in volume
    assert points.mean(0).abs().max() < 0.05


def test_mask_carving_keeps_points_inside_the_object():
    scene = read_transforms(sample_scene_path(), "train")
    radius = init.visible_radius(scene.cameras)
    assert radius == pytest.approx(4.0 * math.sin(0.5 * 0.6911112070083618), rel=1e-4)
    points, colors = init.carve_by_masks(scene.cameras, scene.rgba, 3000, radius, torch.Generator().manual_seed(0))
    assert len(points) == 3000 and colors.shape == (3000, 3)
    # the toy lies within |x|, |y| <= 0.8 and z <= 0.6 (ball top); below it the cameras (>= -11.5 degrees
    # elevation) cannot carve, so the hull may reach lower
    assert (points[:, :2].abs() <= 0.85).all() and (points[:, 2] <= 0.65).all()
    # every point projects onto foreground in every view that sees it
    uv, z = init.project_points(points, scene.cameras)
    col, row = uv[..., 0].long().clamp(0, 63), uv[..., 1].long().clamp(0, 63)
    alpha = scene.rgba[torch.arange(len(scene))[:, None], row, col, 3]
    assert (alpha > 127).all()
    with pytest.raises(ValueError, match="carve away every point"):
        init.carve_by_masks(scene.cameras, torch.zeros_like(scene.rgba), 10, radius, max_rounds=1)


def test_point_cloud_and_mesh_initialization(tmp_path, data_dir):
    data = np.zeros(4, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    data["x"], data["red"], data["blue"] = [0, 1, 2, 3], [255, 0, 51, 102], 255
    PlyData([PlyElement.describe(data, "vertex")]).write(str(tmp_path / "cloud.ply"))
    points, colors = init.read_point_cloud(tmp_path / "cloud.ply")
    assert torch.equal(points[:, 0], torch.tensor([0.0, 1, 2, 3]))
    assert torch.allclose(colors[:, 0], torch.tensor([1.0, 0.0, 0.2, 0.4])) and torch.allclose(colors[:, 2], torch.ones(4))
    import trimesh

    mesh = trimesh.load(str(data_dir / "meshes" / "suzanne" / "suzanne.obj"), force="mesh")
    points, _ = init.sample_mesh(data_dir / "meshes" / "suzanne" / "suzanne.obj", 300, up_axis="+z")  # the file's frame
    # every sample lies on some triangle: in its plane with barycentric coordinates in [0, 1]
    tri = torch.tensor(mesh.triangles, dtype=torch.float64)  # [F, 3, 3]
    p = points.double()[:, None]  # [S, 1, 3]
    e1, e2, d = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], p - tri[:, 0]
    normal = torch.nn.functional.normalize(torch.cross(e1, e2, dim=-1), dim=-1)
    in_plane = (d * normal).sum(-1).abs() < 1e-5
    d11, d12, d22 = (e1 * e1).sum(-1), (e1 * e2).sum(-1), (e2 * e2).sum(-1)
    dp1, dp2 = (d * e1).sum(-1), (d * e2).sum(-1)
    det = d11 * d22 - d12 * d12
    u, v = (d22 * dp1 - d12 * dp2) / det, (d11 * dp2 - d12 * dp1) / det
    inside = (u >= -1e-6) & (v >= -1e-6) & (u + v <= 1 + 1e-6)
    assert len(points) == 300 and (in_plane & inside).any(dim=1).all()


def _sphere_masks(radius: float, views: int = 16, size: int = 96):
    """RGBA views [C, H, W, 4] uint8 of a sphere of ``radius`` at the origin (alpha 255 where a pixel's center ray
    hits it), from cameras on a Fibonacci sphere of radius 3 looking at it, and those cameras."""
    from lift3d.cameras import Cameras, intrinsics_matrix, look_at

    i = torch.arange(views, dtype=torch.float64) + 0.5
    z = 1 - 2 * i / views
    azimuth = math.pi * (1 + 5**0.5) * i
    ring = torch.sqrt(1 - z * z)
    eye = (3.0 * torch.stack([ring * torch.cos(azimuth), ring * torch.sin(azimuth), z], -1)).float()
    up = torch.where(z.abs()[:, None] > 0.99, torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0])).float()
    focal, center = torch.full((views,), 2.0 * size), torch.full((views,), size / 2)  # the sphere fills 2/3 of a view
    cameras = Cameras(look_at(eye, torch.zeros_like(eye), up), intrinsics_matrix(focal, focal, center, center), size, size)
    origins, directions = cameras.rays(normalized=True)
    along = -(origins * directions).sum(-1)  # ray parameter of the closest approach to the origin
    miss = (origins + along[..., None] * directions).norm(dim=-1)
    alpha = (miss < radius).to(torch.uint8) * 255
    return cameras, torch.cat([torch.full(alpha.shape + (3,), 128, dtype=torch.uint8), alpha[..., None]], -1)


def test_hull_surface_points_lie_on_a_sphere_facing_out():
    cameras, rgba = _sphere_masks(0.5)
    points, colors, normals = init.hull_surface(cameras, rgba, 4000, 0.8, torch.Generator().manual_seed(0), resolution=64)
    assert points.shape == normals.shape == colors.shape == (4000, 3)
    r = points.norm(dim=-1)
    cell = 1.6 / 63
    # on the sphere to within a third of a cell for 90 % (the boundary cells' centers alone: 0.9 of a cell), never a
    # cell inside it (the silhouettes' pixels are a third of a cell wide)
    assert (r - 0.5).abs().quantile(0.9) < cell / 3 and (r > 0.5 - cell).all()
    assert ((normals * points / r[:, None]).sum(-1) > 0.9).float().mean() > 0.95  # facing away from the center
    assert torch.allclose(colors, torch.full_like(colors, 128 / 255), atol=1e-4)
    with pytest.raises(ValueError, match="carve away every point"):
        init.hull_surface(cameras, torch.zeros_like(rgba), 10, 0.8, resolution=16)


def test_surfels_start_facing_the_normals_they_are_given():
    from lift3d.gaussians.surfels import SurfelModel
    from lift3d.rotations import quaternion_to_matrix

    normals = torch.nn.functional.normalize(torch.randn(500, 3, generator=torch.Generator().manual_seed(1)), dim=-1)
    normals[0] = torch.tensor([1.0, 0.0, 0.0])  # along the fallback axis of the tangent
    model = SurfelModel({"sh_degree": 0})
    model.initialize(torch.randn(500, 3), normals=normals)
    axes = quaternion_to_matrix(model.quats)
    assert torch.allclose(axes[..., 2], normals, atol=1e-5)  # a surfel's normal is its rotation's third column
    assert torch.allclose(torch.linalg.det(axes), torch.ones(500), atol=1e-5)
