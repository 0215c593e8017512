"""The registered mesh renderer: the image-batch contract, color sources, and fitting a mesh to
silhouettes by gradient descent through the antialiased coverage."""

from __future__ import annotations

import math

import pytest
import torch
import trimesh

from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.meshes.mesh import Mesh
from lift3d.meshes.regularizers import laplacian_smoothing
from lift3d.meshes.topology import edge_topology
from lift3d.registry import find


def sphere_mesh(subdivisions: int = 2, radius: float = 0.5) -> Mesh:
    s = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    return Mesh(torch.tensor(s.vertices, dtype=torch.float32), torch.tensor(s.faces, dtype=torch.long))


def orbit(n: int, size: int, elevation: float = 20.0) -> Cameras:
    c2w = orbit_c2w(n, elevation_deg=elevation, distance=2.0, start_azimuth_deg=10.0)
    return Cameras(c2w, intrinsics_from_fovy(torch.full((n,), math.radians(40.0)), size, size), size, size)


def test_outputs_follow_the_renderer_contract():
    mesh = sphere_mesh()
    cams = orbit(2, 20)
    background = torch.tensor([[0.1, 0.2, 0.3], [0.9, 0.8, 0.7]])
    out = find("mesh-rasterizer")()(mesh, cams, background=background)
    assert out["rgb"].shape == (2, 20, 20, 3) and out["alpha"].shape == (2, 20, 20, 1)
    assert out["depth"].shape == (2, 20, 20, 1) and out["normal"].shape == (2, 20, 20, 3)
    empty = out["alpha"][..., 0] == 0
    assert empty.any() and (out["alpha"] == 1).any() and ((out["alpha"] > 0) & (out["alpha"] < 1)).any()
    assert (out["alpha"] >= 0).all() and (out["alpha"] <= 1 + 1e-6).all()
    torch.testing.assert_close(out["rgb"][empty], background[:, None, None].expand(2, 20, 20, 3)[empty])
    assert (out["depth"][empty] == 0).all() and (out["normal"][empty] == 0).all()
    full = out["alpha"][..., 0] == 1
    # the sphere's depth from the camera at distance 2 lies in [2 - r, 2]; its normals face the camera
    assert (out["depth"][full] > 1.49).all() and (out["depth"][full] < 2.0).all()
    torch.testing.assert_close(out["normal"][full].norm(dim=-1), torch.ones(int(full.sum())), atol=1e-5, rtol=0)
    to_camera = cams.positions[:, None, None, :] / 2.0
    assert ((out["normal"] * to_camera).sum(-1)[full] > 0).all()
    # rgb composites the default gray surface color over the background with alpha
    expected = out["alpha"] * 0.8 + (1 - out["alpha"]) * background[:, None, None]
    torch.testing.assert_close(out["rgb"], expected, atol=1e-5, rtol=0)


def test_color_sources_and_color_fn():
    mesh = sphere_mesh(1)
    cams = orbit(1, 16)
    renderer = find("mesh-rasterizer")({"antialias": False})
    mesh.vertex_colors = (mesh.vertices + 0.5).clamp(0, 1)
    by_vertex = renderer(mesh, cams)
    seen = {}

    def color_fn(surface):
        seen.update(surface)
        return (surface["points"] + 0.5).clamp(0, 1)

    by_fn = renderer(mesh, cams, background=torch.zeros(3), color_fn=color_fn)
    n = int(by_fn["mask"].sum())
    assert set(seen) == {"points", "normals", "view_dirs", "batch_index", "face_index"}
    assert all(v.shape[0] == n for v in seen.values())
    torch.testing.assert_close(seen["view_dirs"].norm(dim=-1), torch.ones(n))
    mask = by_fn["mask"][..., 0]
    # vertex colors equal to positions, interpolated linearly = the color function of the points
    torch.testing.assert_close(by_fn["rgb"][mask], by_vertex["rgb"][mask], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="color_fn must return"):
        renderer(mesh, cams, color_fn=lambda s: s["points"][:1])


def test_bad_config_and_background_are_reported():
    with pytest.raises(ValueError, match="normal_type"):
        find("mesh-rasterizer")({"normal_type": "smooth"})
    with pytest.raises(ValueError, match="background"):
        find("mesh-rasterizer")()(sphere_mesh(0), orbit(1, 8), background=torch.zeros(2))
    with pytest.raises(ValueError, match="Mesh.faces"):
        Mesh(torch.zeros(3, 3), torch.zeros(1, 3))


def test_fitting_vertices_to_silhouettes_reduces_the_loss():
    """Deform a sphere into an ellipsoid from 4 target silhouettes: only antialiasing moves the outline."""
    torch.manual_seed(0)
    sphere = sphere_mesh(2)
    target_mesh = Mesh(sphere.vertices * torch.tensor([1.35, 0.75, 1.0]), sphere.faces)
    cams = orbit(4, 24)
    renderer = find("mesh-rasterizer")()
    topology = edge_topology(sphere.faces)
    with torch.no_grad():
        target = renderer(target_mesh, cams, topology=topology)["alpha"]
    offsets = torch.zeros_like(sphere.vertices, requires_grad=True)
    optimizer = torch.optim.Adam([offsets], lr=0.01)
    losses = []
    for _ in range(40):
        vertices = sphere.vertices + offsets
        alpha = renderer(Mesh(vertices, sphere.faces), cams, topology=topology)["alpha"]
        loss = ((alpha - target) ** 2).mean()
        losses.append(loss.item())
        optimizer.zero_grad()
        (loss + 0.1 * laplacian_smoothing(vertices, sphere.faces, topology)).backward()
        optimizer.step()
    assert losses[-1] < 0.3 * losses[0], losses


def test_procedural_sphere_is_closed_and_outward():
    from lift3d.meshes.primitives import sphere_with_faces

    mesh = sphere_with_faces(1000, bumps=0.1)
    topology = edge_topology(mesh.faces)
    assert abs(mesh.num_faces - 1000) < 100 and (topology.edge_face_count == 2).all()
    assert mesh.num_vertices - topology.edges.shape[0] + mesh.num_faces == 2
    tri = mesh.vertices[mesh.faces]
    normal = torch.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], dim=-1)
    assert ((normal * tri.mean(1)).sum(-1) > 0).all()
