"""The triangle mesh: what geometry parts produce, the mesh renderer draws, meshing extracts and the exporters write.

One class for both sides. A mesh's arrays are all torch tensors (geometry parts, the renderer, the regularizers:
differentiable, on any device) or all numpy arrays (marching cubes, clean-up, UV atlases, the file writers);
``numpy()`` and ``to(device)`` convert. A texture is float in 0..1 as a tensor and uint8 as a numpy array (what image
files hold); the conversions map one to the other. Numpy meshes are checked in full (dtypes made float32 / int64,
indices in range); tensor meshes by shape only, so a training step never waits on the device for a check.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor


def face_normals(vertices: Tensor, faces: Tensor, unit: bool = True) -> Tensor:
    """Normals [F, 3] of counter-clockwise triangles (right-hand rule); unnormalized ones are 2 x area long."""
    v0, v1, v2 = vertices[faces[:, 0]], vertices[faces[:, 1]], vertices[faces[:, 2]]
    n = torch.cross(v1 - v0, v2 - v0, dim=-1)
    return n / n.norm(dim=-1, keepdim=True).clamp_min(1e-20) if unit else n


def vertex_normals(vertices: Tensor, faces: Tensor) -> Tensor:
    """Unit area-weighted vertex normals [V, 3] (differentiable; isolated vertices get +z). Sums run corner 0 of every
    face, then corner 1, then corner 2, the same order on every device and for every dtype."""
    n = face_normals(vertices, faces, unit=False)
    acc = torch.zeros_like(vertices).index_add(0, faces.T.reshape(-1), n.repeat(3, 1))
    norm = acc.norm(dim=-1, keepdim=True)
    fallback = torch.tensor([0.0, 0.0, 1.0], dtype=vertices.dtype, device=vertices.device).expand_as(acc)
    return torch.where(norm > 1e-20, acc / norm.clamp_min(1e-20), fallback)


INDEX_FIELDS = ("faces", "uv_faces")  # integer arrays: they keep an integer dtype through every conversion


@dataclass
class Mesh:
    """A triangle mesh in world space (+z up), with optional vertex colors, normals and a UV texture.

    ``faces`` index welded ``vertices``. UVs either hold one row per vertex (``uv_faces`` None: what UV atlases
    and the file writers use) or have their own index buffer ``uv_faces`` (as in OBJ files: each face corner its own
    UV, so seams do not split the surface)."""

    vertices: Any  # [V, 3] float, world space (+z up)
    faces: Any  # [F, 3] integer vertex indices, counter-clockwise seen from outside
    vertex_colors: Any = None  # [V, 3] float in 0..1, sRGB
    normals: Any = None  # [V, 3] float, unit outward vertex normals
    uv: Any = None  # [V, 2] (or [Vt, 2] with uv_faces) texture coordinates, (0, 0) = bottom-left of the texture
    uv_faces: Any = None  # [F, 3] integer indices into ``uv`` (None: ``uv`` is per vertex)
    texture: Any = None  # [H, W, C] albedo, row 0 = top of the image: float in 0..1 (tensor) or uint8 (numpy)

    def __post_init__(self) -> None:
        if isinstance(self.vertices, Tensor):
            self._as_tensors()
        else:
            self._as_arrays()
        v, f = self.vertices, self.faces
        if v.ndim != 2 or v.shape[1] != 3:
            raise ValueError(f"Mesh.vertices must be [V, 3], got {tuple(v.shape)}")
        if f.ndim != 2 or f.shape[1] != 3:
            raise ValueError(f"Mesh.faces must be [F, 3], got {tuple(f.shape)}")
        for name in ("vertex_colors", "normals") + (("uv",) if self.uv_faces is None else ()):
            value = getattr(self, name)
            width = 2 if name == "uv" else 3
            if value is not None and tuple(value.shape) != (len(v), width):
                raise ValueError(f"Mesh.{name} must be [{len(v)}, {width}], got {tuple(value.shape)}")
        if self.uv_faces is not None:
            if self.uv is None or tuple(self.uv_faces.shape) != tuple(f.shape):
                raise ValueError(f"Mesh.uv_faces must match faces {tuple(f.shape)} and come with uv")
            if self.uv.ndim != 2 or self.uv.shape[1] != 2:
                raise ValueError(f"Mesh.uv must be [Vt, 2], got {tuple(self.uv.shape)}")
        if self.texture is not None and (self.uv is None or self.texture.ndim != 3):
            raise ValueError("a Mesh's texture must be [H, W, C] and needs uv")
        if not self.is_tensor:  # indices in range (tensor meshes skip it: no device sync in a training step)
            counts = {"faces": ("vertices", len(v)), "uv_faces": ("uv", 0 if self.uv is None else len(self.uv))}
            for name, (target, count) in counts.items():
                index = getattr(self, name)
                if index is not None and len(index) and (index.min() < 0 or index.max() >= count):
                    raise ValueError(f"Mesh.{name} index {target} outside 0..{count - 1}")

    def _as_arrays(self) -> None:
        """Numpy arrays (tensors given are copied to the CPU), float32 and int64."""
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            if isinstance(value, Tensor):
                value = value.detach().cpu().numpy()
            if item.name == "texture":
                value = np.asarray(value)
                if value.dtype != np.uint8:
                    value = np.round(np.clip(value.astype(np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)
            else:
                value = np.ascontiguousarray(value, dtype=np.int64 if item.name in INDEX_FIELDS else np.float32)
            setattr(self, item.name, value)

    def _as_tensors(self) -> None:
        """Tensors on the vertices' device (numpy arrays given are converted; a uint8 texture becomes 0..1)."""
        for item in fields(self)[1:]:
            value = getattr(self, item.name)
            if value is None:
                continue
            if not isinstance(value, Tensor):
                value = torch.as_tensor(np.asarray(value), device=self.vertices.device)
            if item.name == "texture" and value.dtype == torch.uint8:
                value = value.float() / 255.0
            setattr(self, item.name, value)
        for name in INDEX_FIELDS:
            value = getattr(self, name)
            if value is not None and value.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"Mesh.{name} must be an integer tensor, got {value.dtype}")

    @property
    def is_tensor(self) -> bool:
        """True when the arrays are torch tensors, False when they are numpy arrays."""
        return isinstance(self.vertices, Tensor)

    @property
    def num_vertices(self) -> int:
        return int(self.vertices.shape[0])

    @property
    def num_faces(self) -> int:
        return int(self.faces.shape[0])

    def face_normals(self) -> Any:
        """Unit face normals [F, 3] (numpy meshes: computed in float64, returned float32)."""
        if self.is_tensor:
            return face_normals(self.vertices, self.faces)
        return face_normals(torch.from_numpy(self.vertices).double(), torch.from_numpy(self.faces)).float().numpy()

    def vertex_normals(self) -> Any:
        """Unit area-weighted vertex normals [V, 3] (numpy meshes: computed in float64, returned float32)."""
        if self.is_tensor:
            return vertex_normals(self.vertices, self.faces)
        return vertex_normals(torch.from_numpy(self.vertices).double(), torch.from_numpy(self.faces)).float().numpy()

    def with_normals(self) -> Mesh:
        """This mesh with its area-weighted vertex normals in ``normals``."""
        return replace(self, normals=self.vertex_normals())

    def numpy(self) -> Mesh:
        """The mesh as numpy arrays on the CPU (itself when it already is; tensors are detached)."""
        if not self.is_tensor:
            return self
        values = {item.name: getattr(self, item.name) for item in fields(self)}
        return Mesh(**{**values, "vertices": self.vertices.detach().cpu().numpy()})  # the rest converts in _as_arrays

    def to(self, *args: Any, **kwargs: Any) -> Mesh:
        """The mesh as tensors moved to another device / dtype (``torch.Tensor.to``'s arguments; index arrays keep their
        integer dtype). A numpy mesh becomes tensors first."""
        device = torch.empty(0).to(*args, **kwargs).device

        def move(name: str, value: Any) -> Any:
            if value is None:
                return None
            if not isinstance(value, Tensor):
                value = torch.from_numpy(np.ascontiguousarray(value))
                if name == "texture" and value.dtype == torch.uint8:
                    value = value.float() / 255.0
            return value.to(device) if name in INDEX_FIELDS else value.to(*args, **kwargs)

        return Mesh(**{item.name: move(item.name, getattr(self, item.name)) for item in fields(self)})
