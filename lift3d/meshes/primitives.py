"""Procedural meshes for tests, benchmarks and initial shapes (no files, no extra dependencies)."""

from __future__ import annotations

import math

import torch

from lift3d.meshes.mesh import Mesh


def uv_sphere(rows: int, cols: int, radius: float = 0.5, bumps: float = 0.0, device: torch.device | str | None = None) -> Mesh:
    """A closed latitude-longitude sphere: ``rows`` bands of ``cols`` segments, 2 * cols * (rows - 1)
    faces, counter-clockwise from outside. ``bumps`` > 0 modulates the radius (a relative amplitude)
    so silhouettes and self-occlusion look like an asset's."""
    if rows < 2 or cols < 3:
        raise ValueError(f"uv_sphere needs rows >= 2 and cols >= 3, got {rows}, {cols}")
    theta = torch.linspace(0, math.pi, rows + 1, device=device)[1:-1]  # interior rings; poles added below
    phi = torch.arange(cols, device=device) * (2 * math.pi / cols)
    t, p = torch.meshgrid(theta, phi, indexing="ij")
    r = radius * (1 + bumps * torch.sin(5 * t) * torch.cos(7 * p))
    ring = torch.stack([r * torch.sin(t) * torch.cos(p), r * torch.sin(t) * torch.sin(p), r * torch.cos(t)], -1).reshape(-1, 3)
    vertices = torch.cat([ring, torch.tensor([[0.0, 0.0, radius], [0.0, 0.0, -radius]], device=device)])
    top, bottom = ring.shape[0], ring.shape[0] + 1
    idx = torch.arange(ring.shape[0], device=device).view(rows - 1, cols)
    a, b = idx[:-1], idx[:-1].roll(-1, 1)
    c, d = idx[1:], idx[1:].roll(-1, 1)
    bands = torch.cat([torch.stack([a, c, d], -1).reshape(-1, 3), torch.stack([a, d, b], -1).reshape(-1, 3)])
    cap_top = torch.stack([torch.full_like(idx[0], top), idx[0], idx[0].roll(-1)], -1)
    cap_bottom = torch.stack([torch.full_like(idx[-1], bottom), idx[-1].roll(-1), idx[-1]], -1)
    return Mesh(vertices, torch.cat([bands, cap_top, cap_bottom]))


def sphere_with_faces(target_faces: int, radius: float = 0.5, bumps: float = 0.0,
                      device: torch.device | str | None = None) -> Mesh:
    """A ``uv_sphere`` with about ``target_faces`` faces (columns = 2 x rows)."""
    rows = max(2, int(round(math.sqrt(target_faces / 4))))
    return uv_sphere(rows, 2 * rows, radius, bumps, device)
