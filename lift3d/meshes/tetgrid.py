"""A tetrahedral grid generated in code (no downloaded tet files): each cube of a regular grid is split
into the 6 tetrahedra of its Kuhn (Freudenthal) triangulation, which all share the cube's main
diagonal, so neighboring cubes split their shared faces the same way and the grid is conforming."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor


def _kuhn_cube() -> Tensor:
    """[6, 4] corner ids (bit 0: +x, bit 1: +y, bit 2: +z) of the cube's tets, positively oriented."""
    corners = torch.tensor([[(c >> k) & 1 for k in range(3)] for c in range(8)], dtype=torch.float64)
    tets = []
    for perm in itertools.permutations(range(3)):
        path = [0, 1 << perm[0], (1 << perm[0]) | (1 << perm[1]), 7]  # walk to the far corner one axis at a time
        p = corners[path]
        if torch.linalg.det(p[1:] - p[0]) < 0:
            path[1], path[2] = path[2], path[1]
        tets.append(path)
    return torch.tensor(tets, dtype=torch.long)


def tet_grid(resolution: int, radius: float = 1.0, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Vertices [(N+1)^3, 3] spanning [-radius, radius]^3 and tets [6 N^3, 4] (positive volume) of an
    N = ``resolution`` cube grid."""
    if resolution < 1:
        raise ValueError(f"tet grid resolution must be >= 1, got {resolution}")
    n = resolution + 1
    axis = torch.linspace(-radius, radius, n, device=device)
    vertices = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
    cube = torch.arange(resolution, device=device)
    ix, iy, iz = torch.meshgrid(cube, cube, cube, indexing="ij")
    base = ((ix * n + iy) * n + iz).reshape(-1)  # vertex id of each cube's (-x, -y, -z) corner
    corner = torch.tensor([((c & 1) * n + ((c >> 1) & 1)) * n + ((c >> 2) & 1) for c in range(8)], device=device)
    tets = base[:, None, None] + corner[_kuhn_cube().to(device)]  # [N^3, 6, 4]
    return vertices, tets.reshape(-1, 4)


def tet_edges(tets: Tensor) -> Tensor:
    """Unique undirected edges [E, 2] (smaller id first) of ``tets`` [T, 4]."""
    pairs = torch.tensor([[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]], device=tets.device)
    edges = tets[:, pairs].reshape(-1, 2).sort(dim=-1).values
    return torch.unique(edges, dim=0)


def grid_edges(resolution: int, device: torch.device | str | None = None) -> Tensor:
    """Unique edges [E, 2] of ``tet_grid(resolution)`` built directly: in a Kuhn grid each vertex links
    to its +x, +y, +z, face-diagonal and body-diagonal neighbors (corner sets nested in one cube)."""
    n = resolution + 1
    index = torch.arange(n**3, device=device).view(n, n, n)
    edges = []
    for step in range(1, 8):
        dx, dy, dz = step & 1, (step >> 1) & 1, (step >> 2) & 1
        a = index[: n - dx, : n - dy, : n - dz]
        b = index[dx:, dy:, dz:]
        edges.append(torch.stack([a.reshape(-1), b.reshape(-1)], dim=-1))
    return torch.cat(edges)
