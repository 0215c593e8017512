"""Edge connectivity of triangle meshes: shared by the antialiasing pass and the regularizers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class EdgeTopology:
    """Undirected edges of a triangle mesh and which faces use them."""

    edges: Tensor  # [E, 2] long vertex ids, smaller first
    face_edges: Tensor  # [F, 3] long: edge id of the face's edges (v0, v1), (v1, v2), (v2, v0)
    edge_face_count: Tensor  # [E] long: how many faces share each edge (1: boundary, 2: manifold)
    face_adjacency: Tensor | None = None  # [F, 3] long: face across each edge slot, -1 if none (filled by edge_topology)


def edge_topology(faces: Tensor) -> EdgeTopology:
    """Edges of ``faces`` [F, 3]; compute once per connectivity and reuse while only positions change."""
    faces = faces.long()
    corners = torch.stack([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]], dim=1)  # [F, 3, 2]
    ordered = corners.sort(dim=-1).values
    base = int(faces.max()) + 1 if faces.numel() else 1
    key = ordered[..., 0] * base + ordered[..., 1]
    unique, inverse = torch.unique(key.reshape(-1), return_inverse=True)
    counts = torch.bincount(inverse, minlength=unique.numel())
    edges = torch.stack([torch.div(unique, base, rounding_mode="floor"), unique % base], dim=-1)
    topology = EdgeTopology(edges, inverse.view(-1, 3), counts)
    topology.face_adjacency = face_adjacency(topology)
    return topology


def manifold_face_pairs(topology: EdgeTopology) -> tuple[Tensor, Tensor]:
    """The two faces [P, 2] on each edge shared by exactly two faces, and those edges' ids [P]."""
    slots = topology.face_edges.reshape(-1)
    order = torch.argsort(slots, stable=True)
    faces_sorted = torch.div(order, 3, rounding_mode="floor")
    starts = torch.cumsum(topology.edge_face_count, 0) - topology.edge_face_count
    two = torch.nonzero(topology.edge_face_count == 2).squeeze(-1)
    first = starts[two]
    return torch.stack([faces_sorted[first], faces_sorted[first + 1]], dim=-1), two


def face_adjacency(topology: EdgeTopology) -> Tensor:
    """[F, 3] long: the face across each face's edge (v_k, v_k+1); -1 at boundary and non-manifold edges."""
    adjacency = torch.full_like(topology.face_edges, -1)
    pairs, edge = manifold_face_pairs(topology)
    for side in (0, 1):
        face = pairs[:, side]
        slot = (topology.face_edges[face] == edge[:, None]).long().argmax(-1)
        adjacency[face, slot] = pairs[:, 1 - side]
    return adjacency
