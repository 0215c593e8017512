"""Differentiable marching tetrahedra: per-vertex signed distances on a tet grid -> a triangle mesh.

Surface vertices sit where the SDF, interpolated linearly along a tet edge, is zero, so they move with
both the SDF values and the (deformed) grid positions: gradients reach both. Each sign-changing edge
gives one vertex shared by all tets around it, so the mesh is watertight. Convention: SDF < 0 inside.
"""

from __future__ import annotations

import torch
from torch import Tensor

# the six edges of a tet as pairs of its local vertex ids
TET_EDGES = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))


def _edge_slot(a: int, b: int) -> int:
    return TET_EDGES.index((min(a, b), max(a, b)))


def _case_table() -> tuple[Tensor, Tensor]:
    """Triangles [16, 2, 3] as local edge slots (-1: none) per inside-bit pattern, and counts [16].
    Orientation is fixed later from the geometry, so the table only needs the right edges."""
    table = torch.full((16, 2, 3), -1, dtype=torch.long)
    count = torch.zeros(16, dtype=torch.long)
    for case in range(16):
        inside = [k for k in range(4) if case >> k & 1]
        outside = [k for k in range(4) if not case >> k & 1]
        if len(inside) in (1, 3):
            lone = inside[0] if len(inside) == 1 else outside[0]
            others = [k for k in range(4) if k != lone]
            table[case, 0] = torch.tensor([_edge_slot(lone, k) for k in others])
            count[case] = 1
        elif len(inside) == 2:
            (a, b), (c, d) = inside, outside
            ring = [_edge_slot(a, c), _edge_slot(a, d), _edge_slot(b, d), _edge_slot(b, c)]  # cyclic around the quad
            table[case, 0] = torch.tensor([ring[0], ring[1], ring[2]])
            table[case, 1] = torch.tensor([ring[0], ring[2], ring[3]])
            count[case] = 2
    return table, count


_TABLE, _COUNT = _case_table()


def marching_tets(vertices: Tensor, sdf: Tensor, tets: Tensor) -> tuple[Tensor, Tensor]:
    """Mesh (vertices [M, 3], faces [F, 3] long, outward counter-clockwise) of the zero level set of
    ``sdf`` [V] over tet-grid ``vertices`` [V, 3] and ``tets`` [T, 4]; differentiable in both."""
    device = vertices.device
    with torch.no_grad():
        inside = sdf < 0
        tet_inside = inside[tets]  # [T, 4]
        n_inside = tet_inside.sum(-1)
        crossing_tets = tets[(n_inside > 0) & (n_inside < 4)]
        if crossing_tets.numel() == 0:
            return vertices.new_zeros(0, 3), torch.zeros(0, 3, dtype=torch.long, device=device)
        slots = torch.tensor(TET_EDGES, device=device)
        ends = crossing_tets[:, slots].sort(dim=-1).values  # [T', 6, 2]
        changes = inside[ends[..., 0]] != inside[ends[..., 1]]  # [T', 6]
        key = ends[..., 0] * vertices.shape[0] + ends[..., 1]
        unique_key, inverse = torch.unique(key[changes], return_inverse=True)
        edge_vertex = torch.full(changes.shape, -1, dtype=torch.long, device=device)
        edge_vertex[changes] = inverse
        edges = torch.stack([unique_key // vertices.shape[0], unique_key % vertices.shape[0]], dim=-1)  # [M, 2]
        case = (inside[crossing_tets].long() << torch.arange(4, device=device)).sum(-1)
        table, count = _TABLE.to(device), _COUNT.to(device)
        local = table[case]  # [T', 2, 3]
        used = torch.arange(2, device=device)[None, :] < count[case][:, None]  # [T', 2]
        faces = edge_vertex.gather(1, local.clamp_min(0).reshape(len(case), -1)).view(-1, 2, 3)[used]  # [F, 3]

    s_a, s_b = sdf[edges[:, 0]].unsqueeze(-1), sdf[edges[:, 1]].unsqueeze(-1)
    p_a, p_b = vertices[edges[:, 0]], vertices[edges[:, 1]]
    points = (p_a * s_b - p_b * s_a) / (s_b - s_a)  # the zero of the linear interpolant along the edge

    with torch.no_grad():  # orient each triangle so its normal points from inside to outside
        tri = points[faces]
        normal = torch.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], dim=-1)
        a, b = edges[faces[:, 0], 0], edges[faces[:, 0], 1]
        outward = torch.where(inside[a].unsqueeze(-1), vertices[b] - vertices[a], vertices[a] - vertices[b])
        flip = (normal * outward).sum(-1) < 0
        faces = torch.where(flip.unsqueeze(-1), faces[:, [0, 2, 1]], faces)
    return points, faces
