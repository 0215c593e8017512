"""Gaussians as a density/color field, meshes from Gaussians, and colors back-projected from renders."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.export import ExportConfig, GaussianField, GaussianTensors, RenderedColors, extract_mesh, gaussian_bbox
from lift3d.export.sources import gaussian_sources
from lift3d.rotations import quaternion_to_matrix
from tests.plugins.analytic_sphere import position_color, render_sphere


def fibonacci_sphere(n: int) -> torch.Tensor:
    """``n`` nearly evenly spread unit vectors [n, 3]."""
    i = torch.arange(n, dtype=torch.float64) + 0.5
    polar = torch.acos(1 - 2 * i / n)
    azimuth = math.pi * (1 + 5**0.5) * i
    return torch.stack([torch.cos(azimuth) * torch.sin(polar), torch.sin(azimuth) * torch.sin(polar), torch.cos(polar)],
                       -1).float()


def quats_turning_z_to(normals: torch.Tensor) -> torch.Tensor:
    """wxyz quaternions [n, 4] of the rotations taking +z to each of ``normals`` [n, 3] (unit)."""
    z = torch.tensor([0.0, 0.0, 1.0]).expand_as(normals)
    half = torch.nn.functional.normalize(z + normals, dim=-1)  # the half-way vector: q = (z.h, z x h)
    return torch.cat([(z * half).sum(-1, keepdim=True), torch.cross(z, half, dim=-1)], -1)


def skin_of_sphere(n: int = 1500, radius: float = 0.5, normal_sigma: float = 0.03, opacity: float = 0.9):
    """Flat Gaussians tiling a sphere (tangent scale 0.7 x their spacing), colored by position."""
    normals = fibonacci_sphere(n)
    spacing = math.sqrt(4 * math.pi * radius**2 / n)
    scales = torch.tensor([0.7 * spacing, 0.7 * spacing, normal_sigma]).expand(n, 3).clone()
    means = radius * normals
    g = GaussianTensors(means, scales, quats_turning_z_to(normals), torch.full((n,), opacity), position_color(means))
    peak = opacity * 2 * math.pi * (0.7 * spacing) ** 2 / spacing**2  # density on a flat sheet of such Gaussians
    return g, peak


def reference_density(g: GaussianTensors, points: torch.Tensor, cutoff: float = 3.0):
    """Every point against every Gaussian in float64 via the covariance inverse; also where a pair sits
    on the cutoff (where float rounding may legitimately decide either way)."""
    rot = torch.from_numpy(Rotation.from_quat(g.quats[:, [1, 2, 3, 0]].double().numpy()).as_matrix())
    cov = rot @ torch.diag_embed(g.scales.double() ** 2) @ rot.transpose(1, 2)
    offset = points.double()[:, None] - g.means.double()[None]
    m2 = torch.einsum("mgi,gij,mgj->mg", offset, torch.linalg.inv(cov), offset)
    w = torch.where(m2 <= cutoff**2, g.opacities.double()[None] * torch.exp(-0.5 * m2), torch.zeros_like(m2))
    color = (w @ g.colors.double()) / w.sum(1, keepdim=True).clamp_min(1e-30)
    return w.sum(1), color, ((m2 - cutoff**2).abs() < 1e-3).any(1)


def random_gaussians(n: int, seed: int = 0) -> GaussianTensors:
    gen = torch.Generator().manual_seed(seed)
    return GaussianTensors(
        means=torch.rand(n, 3, generator=gen) * 2 - 1,
        scales=torch.exp(torch.randn(n, 3, generator=gen) * 0.5 - 2.5),
        quats=torch.randn(n, 4, generator=gen),
        opacities=torch.rand(n, generator=gen),
        colors=torch.rand(n, 3, generator=gen),
    )


def test_quaternions_follow_the_wxyz_convention():
    q = torch.randn(50, 4)
    expected = Rotation.from_quat(q[:, [1, 2, 3, 0]].numpy()).as_matrix()
    assert np.allclose(quaternion_to_matrix(q).numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("cell_size, max_pairs, max_entries", [(None, 2**22, 2**25), (0.05, 20000, 2**25), (None, 2**22, 3000)])
def test_field_equals_the_sum_over_all_gaussians(cell_size, max_pairs, max_entries):
    g = random_gaussians(300)
    field = GaussianField(g, cell_size=cell_size, max_pairs=max_pairs, max_entries=max_entries)
    points = torch.rand(4000, 3, generator=torch.Generator().manual_seed(1)) * 2.4 - 1.2
    density, color, on_cutoff = reference_density(g, points)
    ok = ~on_cutoff
    assert ok.sum() > 3900
    assert torch.allclose(field.density(points)[ok].double(), density[ok], atol=1e-5, rtol=1e-5)
    seen = ok & (density > 1e-3)
    assert torch.allclose(field.color(points)[seen].double(), color[seen], atol=1e-4)


def test_color_far_from_every_gaussian_is_the_nearest_ones():
    g = random_gaussians(50)
    far = torch.tensor([[5.0, 5.0, 5.0], [-4.0, 0.0, 0.0]])
    nearest = torch.cdist(far, g.means).argmin(1)
    assert torch.allclose(GaussianField(g).color(far), g.colors[nearest])


def test_gaussian_bbox_holds_every_cutoff_ellipsoid():
    g = random_gaussians(200)
    box = torch.from_numpy(gaussian_bbox(g, 3.0)).float()
    # points on each ellipsoid's 3-sigma surface, in many directions
    dirs = torch.nn.functional.normalize(torch.randn(64, 3), dim=-1)
    surface = g.means[:, None] + torch.einsum("gij,gkj->gki", quaternion_to_matrix(g.quats), 3.0 * g.scales[:, None] * dirs[None])
    assert (surface >= box[0] - 1e-5).all() and (surface <= box[1] + 1e-5).all()


def test_gaussians_on_a_sphere_mesh_at_the_predicted_offset():
    radius, sigma_n = 0.5, 0.03
    g, peak = skin_of_sphere(radius=radius, normal_sigma=sigma_n)
    field = GaussianField(g)
    resolution = 48
    box = gaussian_bbox(g)
    voxel = (box[1] - box[0]).max() / (resolution - 1)
    # a sheet of Gaussians has density peak * exp(-h^2 / (2 sigma_n^2)) at height h: at level peak / 2
    # the surface sits at h = sigma_n sqrt(2 ln 2) on both sides (curvature shifts it by well under a voxel)
    offset = sigma_n * math.sqrt(2 * math.log(2))
    both = extract_mesh(field.density, box, resolution, threshold=peak / 2, opacity_scale=1.0)
    r = np.linalg.norm(both.vertices, axis=1)
    outer = r > radius
    assert 0.3 < outer.mean() < 0.7
    assert np.abs(r[outer] - (radius + offset)).max() < voxel
    assert np.abs(r[~outer] - (radius - offset)).max() < voxel
    solid = extract_mesh(field.density, box, resolution, threshold=peak / 2, fill_holes=True, color_fn=field.color,
                         opacity_scale=1.0)
    r = np.linalg.norm(solid.vertices, axis=1)
    assert np.abs(r - (radius + offset)).max() < voxel
    # colors queried from the Gaussians: those of the points on the sphere under each vertex
    expected = position_color(torch.from_numpy(solid.vertices / r[:, None] * radius)).numpy()
    assert np.abs(solid.vertex_colors - expected).max() < 0.03


def test_gaussian_export_with_the_automatic_threshold_stays_near_the_skin():
    radius, sigma_n = 0.5, 0.03
    g, _ = skin_of_sphere(radius=radius, normal_sigma=sigma_n)
    cfg = ExportConfig(resolution=40, target_faces=0)
    mesh = gaussian_sources(g, cfg).mesh()
    r = np.linalg.norm(mesh.vertices, axis=1)
    voxel = (gaussian_bbox(g)[1] - gaussian_bbox(g)[0]).max() / 39
    assert r.min() > radius - voxel and r.max() < radius + 3 * sigma_n + voxel


def _ring_cameras(n: int, distance: float = 2.5, size: int = 64) -> Cameras:
    angles = torch.arange(n) * 2 * math.pi / n
    eye = torch.stack([distance * torch.cos(angles), distance * torch.sin(angles), torch.full_like(angles, 0.8)], -1)
    c2w = look_at(eye, torch.zeros_like(eye), torch.tensor([0.0, 0.0, 1.0]))
    return Cameras(c2w, intrinsics_from_fovy(torch.full((n,), math.radians(40.0)), size, size), size, size)


def test_back_projected_colors_match_the_surface_colors():
    radius = 0.5
    cameras = _ring_cameras(8)
    colors = RenderedColors(lambda c: render_sphere(c, radius), cameras, batch_size=3)
    dirs = fibonacci_sphere(400)
    points = radius * dirs[dirs[:, 2].abs() < 0.5]  # the band every ring camera sees well
    got = colors(points)
    assert torch.allclose(got, position_color(points), atol=0.01)  # bilinear reading of 64x64 renders


def test_points_no_view_sees_take_the_fallback_color():
    radius = 0.5
    cameras = _ring_cameras(1)  # one camera on +x
    colors = RenderedColors(lambda c: render_sphere(c, radius), cameras, fallback=lambda p: torch.zeros(len(p), 3))
    front, back = torch.tensor([[radius, 0.0, 0.0]]), torch.tensor([[-radius, 0.0, 0.0]])
    assert torch.allclose(colors(front), position_color(front), atol=0.03)
    assert torch.equal(colors(back), torch.zeros(1, 3))  # hidden behind the front: not colored from it
    gray = RenderedColors(lambda c: render_sphere(c, radius), cameras)
    assert torch.allclose(gray(back), torch.full((1, 3), 0.5))


def test_renders_color_a_gaussian_mesh():
    g, _ = skin_of_sphere(n=800, radius=0.5)
    cfg = ExportConfig(resolution=32, target_faces=0, gaussian_colors="render", backproject_views=8, video_width=64,
                       video_height=64, video_distance=2.5)
    sources = gaussian_sources(g, cfg, render_fn=lambda c: render_sphere(c, 0.55))
    mesh = sources.mesh()
    on_sphere = mesh.vertices / np.linalg.norm(mesh.vertices, axis=1, keepdims=True) * 0.55
    err = np.abs(mesh.vertex_colors - position_color(torch.from_numpy(on_sphere)).numpy()).max(1)
    assert np.median(err) < 0.03
    with pytest.raises(ValueError, match="render function"):
        gaussian_sources(g, cfg)
