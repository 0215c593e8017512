"""Tet grid, marching tetrahedra and the DMTet geometry part."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from lift3d.base import BaseModule
from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.meshes.marching_tets import marching_tets
from lift3d.meshes.tetgrid import grid_edges, tet_edges, tet_grid
from lift3d.meshes.topology import edge_topology
from lift3d.registry import find, register


def test_tet_grid_is_a_conforming_partition_of_the_box():
    res, radius = 3, 0.8
    vertices, tets = tet_grid(res, radius)
    assert vertices.shape == ((res + 1) ** 3, 3) and tets.shape == (6 * res**3, 4)
    p = vertices[tets].double()
    volume = torch.linalg.det(p[:, 1:] - p[:, :1]) / 6
    cell = 2 * radius / res
    torch.testing.assert_close(volume, torch.full_like(volume, cell**3 / 6))  # all positive, equal
    # every triangle is shared by two tets, except those on the box's surface
    faces = torch.cat([tets[:, [1, 2, 3]], tets[:, [0, 2, 3]], tets[:, [0, 1, 3]], tets[:, [0, 1, 2]]]).sort(-1).values
    unique, counts = torch.unique(faces, dim=0, return_counts=True)
    assert set(counts.tolist()) == {1, 2}
    on_box = (vertices[unique[counts == 1]].abs() - radius).abs() < 1e-6  # [B, 3 vertices, 3 axes]
    assert on_box.all(1).any(-1).all()  # the three vertices share a box face
    assert (counts == 1).sum() == 6 * 2 * res**2  # two triangles per cube face on the surface
    edges = grid_edges(res)
    assert torch.equal(torch.unique(edges.sort(-1).values, dim=0), tet_edges(tets))


@pytest.mark.parametrize("res", [8, 16])
def test_marching_tets_extracts_a_sphere_within_a_tet_edge(res):
    radius = 0.6
    vertices, tets = tet_grid(res, 1.0)
    points, faces = marching_tets(vertices, vertices.norm(dim=-1) - radius, tets)
    cell = 2.0 / res
    error = (points.norm(dim=-1) - radius).abs().max()
    assert error < math.sqrt(3) * cell  # within the longest tet edge (the criterion) ...
    assert error < 0.15 * cell  # ... and in fact much closer: linear interpolation of a smooth SDF
    topology = edge_topology(faces)
    assert (topology.edge_face_count == 2).all()  # watertight
    assert points.shape[0] - topology.edges.shape[0] + faces.shape[0] == 2  # a sphere's Euler characteristic
    tri = points[faces]
    normal = torch.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], dim=-1)
    assert ((normal * tri.mean(1)).sum(-1) > 0).all()  # counter-clockwise seen from outside
    volume = (tri[:, 0] * torch.cross(tri[:, 1], tri[:, 2], dim=-1)).sum() / 6
    assert abs(volume / (4 / 3 * math.pi * radius**3) - 1) < (0.1 if res == 8 else 0.03)


def test_marching_tets_gradients_match_finite_differences():
    vertices, tets = tet_grid(3, 1.0)
    noise = torch.randn(vertices.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    vertices = vertices.double() + 0.05 * noise
    sdf = vertices.norm(dim=-1) - 0.55
    n_points = marching_tets(vertices, sdf, tets)[0].shape[0]
    weights = torch.randn(n_points, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def loss(v, s):
        points = marching_tets(v, s, tets)[0]
        assert points.shape[0] == n_points
        return (points * weights).sum()

    assert torch.autograd.gradcheck(loss, (vertices.requires_grad_(), sdf.requires_grad_()), eps=1e-6, atol=1e-6)


def test_dmtet_part_sphere_init_deformation_bounds_and_state():
    geometry = find("dmtet")({"grid_resolution": 10, "shape_init_radius": 0.5})
    mesh = geometry()
    assert (mesh.vertices.norm(dim=-1) - 0.5).abs().max() < 0.15 * geometry.cell_size
    assert set(geometry.state_dict()) == {"sdf", "deformation"}  # the grid is regenerated, not saved
    with torch.no_grad():
        geometry.deformation.fill_(100.0)
    offset = (geometry.deformed_vertices() - geometry.grid_vertices).abs().max()
    assert offset <= 0.5 * geometry.cell_size + 1e-6
    with pytest.raises(ValueError, match="shape_init"):
        find("dmtet")({"grid_resolution": 4, "shape_init": "cube"})
    empty = find("dmtet")({"grid_resolution": 4, "shape_init": "none"})
    with pytest.raises(RuntimeError, match="no zero crossing"):
        empty.isosurface()


def test_initialize_from_density_keeps_the_threshold_surface():
    geometry = find("dmtet")({"grid_resolution": 16, "shape_init": "none"})
    radius = math.sqrt(0.18)  # density 5 (1 - |x|^2 / 0.36) equals the threshold 2.5 here
    geometry.initialize_from_density(lambda p: 5.0 * (1.0 - (p**2).sum(-1) / 0.36), threshold=2.5)
    mesh = geometry.isosurface()
    assert (mesh.vertices.norm(dim=-1) - radius).abs().max() < 0.3 * geometry.cell_size
    # rescaled to distances: near the surface the SDF is close to the true signed distance
    near = ((geometry.grid_vertices.norm(dim=-1) - radius).abs() < geometry.cell_size)
    true = geometry.grid_vertices.norm(dim=-1)[near] - radius
    assert (geometry.sdf[near] - true).abs().max() < 0.25 * geometry.cell_size
    with pytest.raises(ValueError, match="never crosses the threshold"):
        geometry.initialize_from_density(lambda p: torch.zeros(p.shape[0]), threshold=2.5)


@dataclass
class _TinyTextureConfig:
    hidden: int = 8  # width of the hidden layer


@register("test-dmtet-texture")
class _TinyTexture(BaseModule):
    Config = _TinyTextureConfig

    def __init__(self, cfg=None) -> None:
        super().__init__(cfg)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, self.cfg.hidden), torch.nn.ReLU(), torch.nn.Linear(self.cfg.hidden, 3))

    def forward(self, points):
        return torch.sigmoid(self.net(points))


def test_texture_hook_and_rendering_gradients_reach_sdf_deformation_and_texture():
    geometry = find("dmtet")({"grid_resolution": 12, "shape_init_radius": 0.45, "texture_type": "test-dmtet-texture",
                              "texture": {"hidden": 4}})
    assert any(k.startswith("texture.") for k in geometry.state_dict())
    cams = Cameras(orbit_c2w(2, 15.0, 2.0), intrinsics_from_fovy(torch.full((2,), math.radians(40.0)), 20, 20), 20, 20)
    out = find("mesh-rasterizer")()(geometry(), cams, color_fn=lambda s: geometry.color(s["points"]))
    (out["rgb"].sum() + out["alpha"].sum()).backward()
    for name, p in geometry.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    with pytest.raises(RuntimeError, match="texture_type"):
        find("dmtet")({"grid_resolution": 4}).color(torch.zeros(1, 3))


def test_fixed_geometry_is_frozen_and_cached():
    geometry = find("dmtet")({"grid_resolution": 6, "fix_geometry": True})
    assert not geometry.sdf.requires_grad and not geometry.deformation.requires_grad
    first = geometry.isosurface()
    assert geometry.isosurface() is first and not first.vertices.requires_grad


def test_dmtet_fits_target_silhouettes():
    """Grow a small DMTet sphere towards the silhouettes of a larger box-like shape."""
    torch.manual_seed(0)
    geometry = find("dmtet")({"grid_resolution": 12, "shape_init_radius": 0.3})
    target_geometry = find("dmtet")({"grid_resolution": 12, "shape_init": "none"})
    target_geometry.initialize_from_sdf(lambda p: (p.abs() - torch.tensor([0.55, 0.35, 0.45])).amax(-1))
    cams = Cameras(orbit_c2w(4, 25.0, 2.2), intrinsics_from_fovy(torch.full((4,), math.radians(40.0)), 24, 24), 24, 24)
    renderer = find("mesh-rasterizer")()
    with torch.no_grad():
        target = renderer(target_geometry(), cams)["alpha"]
    optimizer = torch.optim.Adam(geometry.parameters(), lr=0.02)
    losses = []
    for _ in range(25):
        loss = ((renderer(geometry(), cams)["alpha"] - target) ** 2).mean()
        losses.append(loss.item())
        optimizer.zero_grad()
        (loss + 1e-3 * geometry.sdf_regularizer()).backward()
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0], losses
