"""Mesh regularizers and topology helpers against hand-computed values."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lift3d.meshes.regularizers import laplacian_smoothing, normal_consistency, sdf_sign_flip
from lift3d.meshes.topology import edge_topology, face_adjacency


def grid_mesh(n: int, z=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A planar (or height-field) triangulated n x n grid of vertices."""
    y, x = torch.meshgrid(torch.arange(n, dtype=torch.float64), torch.arange(n, dtype=torch.float64), indexing="ij")
    height = torch.zeros_like(x) if z is None else z(x, y)
    vertices = torch.stack([x, y, height], -1).reshape(-1, 3)
    idx = torch.arange(n * n).view(n, n)
    a, b, c, d = idx[:-1, :-1].reshape(-1), idx[:-1, 1:].reshape(-1), idx[1:, :-1].reshape(-1), idx[1:, 1:].reshape(-1)
    faces = torch.cat([torch.stack([a, b, d], -1), torch.stack([a, d, c], -1)])
    return vertices, faces


def test_normal_consistency_is_zero_on_a_plane_and_one_minus_cos_on_a_fold():
    vertices, faces = grid_mesh(5)
    assert normal_consistency(vertices, faces).abs() < 1e-12
    angle = 0.7  # two triangles hinged on the x axis, the second one lifted by ``angle``
    hinge = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, -1.0, 0.0], [0.5, math.cos(angle), math.sin(angle)]],
                         dtype=torch.float64)
    fold = torch.tensor([[0, 2, 1], [0, 1, 3]])
    torch.testing.assert_close(normal_consistency(hinge, fold), torch.tensor(1 - math.cos(angle), dtype=torch.float64))


def test_laplacian_zero_inside_a_plane_and_hand_value_on_a_tetrahedron():
    vertices, faces = grid_mesh(4)
    topology = edge_topology(faces)
    # a plane's laplacian is only non-zero on the border, and lifting it as a linear function changes nothing
    flat = laplacian_smoothing(vertices, faces, topology)
    x = vertices[:, 0]
    tilt = torch.stack([0 * x, 0 * x, 0.3 * x - 0.2 * vertices[:, 1]], -1)
    tilted = laplacian_smoothing(vertices + tilt, faces, topology)
    bumped = vertices.clone()
    bumped[5, 2] = 1.0  # an interior vertex lifted out of the plane
    assert laplacian_smoothing(bumped, faces, topology) > flat + 0.05
    assert flat > 0 and tilted >= flat
    tet = torch.tensor([[1.0, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], dtype=torch.float64)
    faces = torch.tensor([[0, 1, 2], [0, 3, 1], [0, 2, 3], [1, 3, 2]])
    # every vertex neighbors the other three and the centroid is 0: v - mean(others) = 4/3 v, |v|^2 = 3
    torch.testing.assert_close(laplacian_smoothing(tet, faces), torch.tensor(16 / 9 * 3, dtype=torch.float64))


def test_sdf_sign_flip_hand_value():
    sdf = torch.tensor([-1.0, 2.0, 3.0])
    edges = torch.tensor([[0, 1], [1, 2]])  # only the first edge changes sign
    expected = 0.5 * (F.softplus(torch.tensor(1.0)) + F.softplus(torch.tensor(2.0)))  # BCE(-1, 1) and BCE(2, 0)
    torch.testing.assert_close(sdf_sign_flip(sdf, edges), expected)
    assert sdf_sign_flip(torch.tensor([1.0, 2.0]), torch.tensor([[0, 1]])) == 0


def test_topology_of_a_grid():
    _, faces = grid_mesh(3)
    topology = edge_topology(faces)
    assert topology.edges.shape[0] == 16 and sorted(set(topology.edge_face_count.tolist())) == [1, 2]
    adjacency = face_adjacency(topology)
    for f in range(faces.shape[0]):
        for k in range(3):
            g = int(adjacency[f, k])
            edge = {int(faces[f, k]), int(faces[f, (k + 1) % 3])}
            if g < 0:
                assert sum(edge <= set(faces[h].tolist()) for h in range(faces.shape[0])) == 1
            else:
                assert edge <= set(faces[g].tolist()) and g != f
