"""The triangle mesh that geometry parts produce and the mesh renderer consumes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


def face_normals(vertices: Tensor, faces: Tensor, unit: bool = True) -> Tensor:
    """Normals [F, 3] of counter-clockwise triangles (right-hand rule); unnormalized ones are 2 x area long."""
    v0, v1, v2 = vertices[faces[:, 0]], vertices[faces[:, 1]], vertices[faces[:, 2]]
    n = torch.cross(v1 - v0, v2 - v0, dim=-1)
    return n / n.norm(dim=-1, keepdim=True).clamp_min(1e-20) if unit else n


def vertex_normals(vertices: Tensor, faces: Tensor) -> Tensor:
    """Unit area-weighted vertex normals [V, 3] (differentiable; isolated vertices get +z)."""
    n = face_normals(vertices, faces, unit=False)
    acc = torch.zeros_like(vertices).index_add(0, faces.reshape(-1), n.repeat_interleave(3, dim=0))
    norm = acc.norm(dim=-1, keepdim=True)
    fallback = torch.tensor([0.0, 0.0, 1.0], dtype=vertices.dtype, device=vertices.device).expand_as(acc)
    return torch.where(norm > 1e-20, acc / norm.clamp_min(1e-20), fallback)


@dataclass
class Mesh:
    """A triangle mesh in world space, with optional UV texture and per-vertex colors.

    ``faces`` index welded ``vertices`` (so UV seams do not split the surface); UVs have their own
    index buffer ``uv_faces`` (as in OBJ files), so each face corner can carry its own UV.
    """

    vertices: Tensor  # [V, 3] float, world space (+z up)
    faces: Tensor  # [F, 3] long, counter-clockwise seen from outside
    uv: Tensor | None = None  # [Vt, 2] texture coordinates, (0, 0) = bottom-left of the texture image
    uv_faces: Tensor | None = None  # [F, 3] long indices into ``uv`` (None: same as ``faces``)
    texture: Tensor | None = None  # [Ht, Wt, C] float in 0..1, row 0 = top of the image
    vertex_colors: Tensor | None = None  # [V, C] float in 0..1

    def __post_init__(self) -> None:
        if self.vertices.ndim != 2 or self.vertices.shape[-1] != 3:
            raise ValueError(f"Mesh.vertices must be [V, 3], got {tuple(self.vertices.shape)}")
        if self.faces.ndim != 2 or self.faces.shape[-1] != 3 or self.faces.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"Mesh.faces must be an integer [F, 3] tensor, got {tuple(self.faces.shape)} {self.faces.dtype}")
        if self.uv_faces is not None and self.uv_faces.shape != self.faces.shape:
            raise ValueError(f"Mesh.uv_faces must match faces {tuple(self.faces.shape)}, got {tuple(self.uv_faces.shape)}")
        if self.vertex_colors is not None and self.vertex_colors.shape[0] != self.vertices.shape[0]:
            raise ValueError("Mesh.vertex_colors must have one row per vertex")

    @property
    def num_vertices(self) -> int:
        return self.vertices.shape[0]

    @property
    def num_faces(self) -> int:
        return self.faces.shape[0]

    def face_normals(self) -> Tensor:
        """Unit face normals [F, 3]."""
        return face_normals(self.vertices, self.faces)

    def vertex_normals(self) -> Tensor:
        """Unit area-weighted vertex normals [V, 3]."""
        return vertex_normals(self.vertices, self.faces)

    def to(self, *args, **kwargs) -> Mesh:
        """The mesh moved to another device / dtype (index tensors keep their integer dtype)."""
        def move(t: Tensor | None, floating: bool) -> Tensor | None:
            if t is None:
                return None
            if floating:
                return t.to(*args, **kwargs)
            device = torch.empty(0).to(*args, **kwargs).device
            return t.to(device)

        return replace(
            self,
            vertices=move(self.vertices, True),
            faces=move(self.faces, False),
            uv=move(self.uv, True),
            uv_faces=move(self.uv_faces, False),
            texture=move(self.texture, True),
            vertex_colors=move(self.vertex_colors, True),
        )
