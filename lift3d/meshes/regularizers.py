"""Mesh regularizers for optimizing surfaces (DMTet, vertex fitting): smoothness of normals and of
vertex positions, and the SDF sign-flip penalty that keeps DMTet from growing floaters."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.meshes.mesh import face_normals
from lift3d.meshes.topology import EdgeTopology, edge_topology, manifold_face_pairs


def normal_consistency(vertices: Tensor, faces: Tensor, topology: EdgeTopology | None = None) -> Tensor:
    """Mean of ``1 - cos`` of the angle between the normals of the two faces on each manifold edge
    (0 for a plane); a scalar."""
    topology = edge_topology(faces) if topology is None else topology
    pairs, _ = manifold_face_pairs(topology)
    if pairs.numel() == 0:
        return vertices.sum() * 0.0
    n = face_normals(vertices, faces)
    return (1.0 - (n[pairs[:, 0]] * n[pairs[:, 1]]).sum(-1)).mean()


def laplacian_smoothing(vertices: Tensor, faces: Tensor, topology: EdgeTopology | None = None) -> Tensor:
    """Mean squared length of the uniform Laplacian ``v - mean(neighbors of v)`` over vertices that
    have neighbors (0 for the interior of a regular planar grid); a scalar."""
    topology = edge_topology(faces) if topology is None else topology
    i, j = topology.edges[:, 0], topology.edges[:, 1]
    summed = torch.zeros_like(vertices).index_add(0, i, vertices[j]).index_add(0, j, vertices[i])
    degree = torch.zeros(vertices.shape[0], dtype=vertices.dtype, device=vertices.device)
    ones = torch.ones_like(i, dtype=vertices.dtype)
    degree = degree.index_add(0, i, ones).index_add(0, j, torch.ones_like(j, dtype=vertices.dtype))
    has = degree > 0
    delta = vertices[has] - summed[has] / degree[has].unsqueeze(-1)
    return (delta**2).sum(-1).mean()


def sdf_sign_flip(sdf: Tensor, edges: Tensor) -> Tensor:
    """Binary cross-entropy pushing the SDF at both ends of each sign-changing grid edge [E, 2] towards
    agreement (as nvdiffrec's DMTet does): discourages spurious surfaces; a scalar."""
    s_a, s_b = sdf[edges[:, 0]], sdf[edges[:, 1]]
    change = (s_a > 0) != (s_b > 0)
    if not bool(change.any()):
        return sdf.sum() * 0.0
    s_a, s_b = s_a[change], s_b[change]
    return 0.5 * (
        F.binary_cross_entropy_with_logits(s_a, (s_b > 0).to(s_a)) + F.binary_cross_entropy_with_logits(s_b, (s_a > 0).to(s_b))
    )
