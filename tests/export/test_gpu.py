"""The exporters on CUDA give what they give on CPU (CPU twins: the other test_export_* files)."""

import math

import numpy as np
import pytest
import torch

from lift3d.export import ExportConfig, GaussianField, RenderedColors, extract_mesh, gaussian_bbox
from lift3d.export.views import backproject_cameras
from tests.export.test_gaussians import random_gaussians, skin_of_sphere
from tests.plugins.analytic_sphere import position_color, render_sphere, sphere_density

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def test_gaussian_field_on_cuda_matches_cpu():
    g = random_gaussians(2000)
    points = torch.rand(100000, 3, generator=torch.Generator().manual_seed(2)) * 2.4 - 1.2
    cpu = GaussianField(g)
    gpu = GaussianField(g).to(CUDA)
    # each Gaussian is cut off at 3 sigma, where its weight jumps from opacity * exp(-4.5) to 0: a point within
    # rounding of that shell may count it on one device and not the other; every other point agrees closely
    jump = float(g.opacities.max()) * math.exp(-0.5 * cpu.cutoff_sigma**2)
    density_gpu, density_cpu = gpu.density(points.to(CUDA)).cpu(), cpu.density(points)
    off = ~torch.isclose(density_gpu, density_cpu, atol=1e-4, rtol=1e-4)
    assert off.float().mean() < 1e-3 and ((density_gpu - density_cpu)[off].abs() <= 2 * jump + 1e-4).all()
    color_off = ((gpu.color(points.to(CUDA)).cpu() - cpu.color(points)).abs() > 1e-4).any(-1)
    assert color_off.float().mean() < 1e-3


def test_field_mesh_on_cuda_matches_cpu():
    bbox = torch.tensor([[-1.0, -1, -1], [1, 1, 1]])
    cpu = extract_mesh(lambda p: sphere_density(p, 0.6), bbox, 96, threshold=25.0, color_fn=position_color)
    gpu = extract_mesh(lambda p: sphere_density(p, 0.6), bbox.to(CUDA), 96, threshold=25.0, color_fn=position_color)
    assert gpu.faces.shape == cpu.faces.shape
    # the same surface, whatever order the devices number the vertices in: compare sorted (vertex, color) rows
    # and sorted triangles given by their corner positions
    np.testing.assert_allclose(_sorted_rows(np.hstack([gpu.vertices, gpu.vertex_colors])),
                               _sorted_rows(np.hstack([cpu.vertices, cpu.vertex_colors])), atol=1e-4)
    np.testing.assert_allclose(_triangles(gpu), _triangles(cpu), atol=1e-4)


def _sorted_rows(rows: np.ndarray) -> np.ndarray:
    """Rows in lexicographic order of their values rounded to 1e-3 (robust to tiny rounding differences)."""
    keys = np.round(rows, 3)
    return rows[np.lexsort(keys.T[::-1])]


def _triangles(mesh) -> np.ndarray:
    """Each face as its 9 corner coordinates (corners in lexicographic order), faces sorted."""
    corners = mesh.vertices[mesh.faces]  # [F, 3, 3]
    order = np.lexsort(np.round(corners, 3).transpose(2, 0, 1)[::-1], axis=-1)
    corners = np.take_along_axis(corners, order[..., None], axis=1).reshape(len(corners), 9)
    return _sorted_rows(corners)


def test_gaussian_mesh_and_back_projection_on_cuda():
    g, peak = skin_of_sphere(n=20000)
    gpu_g = type(g)(*(t.to(CUDA) for t in (g.means, g.scales, g.quats, g.opacities, g.colors)))
    field = GaussianField(gpu_g)
    mesh = extract_mesh(field.density, gaussian_bbox(g), 128, threshold=peak / 2, fill_holes=True, color_fn=field.color,
                        opacity_scale=1.0, device=CUDA)
    r = np.linalg.norm(mesh.vertices, axis=1)
    assert np.abs(r - (0.5 + 0.03 * np.sqrt(2 * np.log(2)))).max() < 1.2 / 127
    cfg = ExportConfig(backproject_views=16, video_width=256, video_height=256, video_distance=2.5)
    colors = RenderedColors(lambda c: render_sphere(c, 0.5), backproject_cameras(cfg, CUDA))
    points = torch.from_numpy(mesh.vertices / r[:, None] * 0.5).to(CUDA)
    seen = points[:, 2] > -0.45  # the default rings (+30 and -15 degrees) do not see the bottom cap
    assert (colors(points[seen]) - position_color(points[seen])).abs().max() < 0.02
