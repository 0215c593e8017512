"""Texture field, surface sampling, custom-mesh geometry and the normal map of the mesh stages."""

from __future__ import annotations

import pytest
import torch

from lift3d.meshes.custom_mesh import CustomMeshGeometry
from lift3d.meshes.io import load_mesh
from lift3d.meshes.texture_field import HashGridTexture, fit_texture, sample_surface
from lift3d.systems.mesh_stages import normal_image

SMALL = {"radius": 1.0, "encoding": {"n_levels": 6, "log2_hashmap_size": 12, "base_resolution": 4, "per_level_scale": 1.6}}


def test_texture_field_fits_a_smooth_color_function():
    torch.manual_seed(0)
    field = HashGridTexture(SMALL)
    points = torch.rand(4096, 3) * 1.6 - 0.8
    target = torch.stack([0.5 + 0.4 * torch.sin(3 * points[:, 0]), 0.5 + 0.4 * points[:, 1], 0.5 - 0.4 * points[:, 2] ** 2], -1)
    with torch.no_grad():
        before = float((torch.sigmoid(field(points)) - target).square().mean())
    fit_texture(lambda p: torch.sigmoid(field(p)), list(field.parameters()), points, target, steps=300, lr=0.02, batch_size=1024)
    held = torch.rand(1024, 3) * 1.6 - 0.8
    held_target = torch.stack([0.5 + 0.4 * torch.sin(3 * held[:, 0]), 0.5 + 0.4 * held[:, 1], 0.5 - 0.4 * held[:, 2] ** 2], -1)
    with torch.no_grad():
        after = float((torch.sigmoid(field(held)) - held_target).square().mean())
    assert after < 0.05 * before and after < 2e-3, (before, after)
    assert torch.equal(field.features(held), field(held))  # chunked queries agree
    with pytest.raises(ValueError, match="matching non-empty"):
        fit_texture(field, list(field.parameters()), points, target[:10])


def test_sample_surface_lies_on_the_triangles_and_follows_area():
    vertices = torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [2, 0, 1], [0, 2, 1]])
    faces = torch.tensor([[0, 1, 2], [3, 4, 5]])  # areas 0.5 and 2.0, in the planes z = 0 and z = 1
    points = sample_surface(vertices, faces, 20000, seed=1)
    lower = points[:, 2] == 0
    upper = points[:, 2] == 1
    assert bool((lower | upper).all())
    assert abs(float(upper.float().mean()) - 0.8) < 0.02  # 2.0 / (0.5 + 2.0)
    assert bool((points[lower, :2] >= 0).all() and (points[lower, :2].sum(-1) <= 1 + 1e-6).all())
    assert bool((points[upper, :2] >= 0).all() and (points[upper, :2].sum(-1) <= 2 + 1e-6).all())
    assert torch.equal(points, sample_surface(vertices, faces, 20000, seed=1))


def test_custom_mesh_geometry_keeps_the_file_and_saves_only_the_texture(data_dir):
    path = data_dir / "meshes" / "spot" / "spot.obj"
    geometry = CustomMeshGeometry({"path": str(path), "texture": SMALL})
    expected = load_mesh(path)
    mesh = geometry()
    assert torch.equal(mesh.vertices, expected.vertices) and torch.equal(mesh.faces, expected.faces)
    assert float(mesh.vertices.abs().max()) == pytest.approx(0.5, abs=1e-5)  # normalized to half_extent
    assert all(k.startswith("texture.") for k in geometry.state_dict())
    assert geometry.color(mesh.vertices[:5]).shape == (5, 3)
    with pytest.raises(ValueError, match="geometry.path"):
        CustomMeshGeometry({})
    with pytest.raises(FileNotFoundError, match="nothing.obj"):
        CustomMeshGeometry({"path": str(data_dir / "nothing.obj")})


def test_normal_image_maps_normals_and_blends_the_background():
    normal = torch.tensor([0.0, 0.0, 1.0]).view(1, 1, 1, 3).expand(1, 1, 3, 3).clone()
    alpha = torch.tensor([1.0, 0.5, 0.0]).view(1, 1, 3, 1)
    image = normal_image(normal * alpha, alpha, torch.tensor([0.2, 0.2, 0.2]))
    full = torch.tensor([0.5, 0.5, 1.0])
    assert torch.allclose(image[0, 0, 0], full)
    assert torch.allclose(image[0, 0, 1], 0.5 * full + 0.5 * 0.2)
    assert torch.allclose(image[0, 0, 2], torch.full((3,), 0.2))
