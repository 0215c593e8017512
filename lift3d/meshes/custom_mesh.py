"""A user's mesh as the geometry of a texturing stage (threestudio's ``custom-mesh``): the shape is
fixed, only its texture field is optimized against the prompt.

The file (.obj, .glb, .gltf, .ply, ... through trimesh) is read once, normalized into a box and
rotated into lift3d's frame (+z up, front towards +x); exports undo that (``file_frame``), so they overlay
the input file. Its vertices and faces are buffers rebuilt
from the file, so checkpoints hold only the texture field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded, choice
from lift3d.meshes.io import AXES, load_mesh_in_frame
from lift3d.meshes.mesh import Mesh
from lift3d.meshes.texture_field import interpolate_corners, surface_samples
from lift3d.registry import find, register


@dataclass
class CustomMeshConfig:
    path: str = ""  # the mesh file (.obj, .glb, .gltf, .ply, ...)
    normalize: bool = True  # center the bounding box at the origin and scale its largest half side to half_extent
    half_extent: float = bounded(0.5, above=0)  # half side of the normalized box, scene units
    up_axis: str = choice("+y", among=AXES)  # the file's up axis (+y for glTF and most OBJ exports), mapped to world +z
    front_axis: str = choice("+z", among=AXES)  # the file's front axis, mapped to world +x (seen by the camera at azimuth 0)
    keep_uvs: bool = True  # exports bake into the file's own UVs when it has them (false: a new xatlas atlas)
    texture_type: str = "hash-grid-texture"  # registered texture field, forward(points [N, 3]) -> features [N, C]
    texture: dict = field(default_factory=dict)  # the texture field's config


@register("custom-mesh")
class CustomMeshGeometry(BaseModule):
    """A fixed triangle mesh from a file with a learned texture field; ``forward()`` gives the mesh."""

    Config = CustomMeshConfig
    fixed_geometry = True  # no trainable shape: the regularizers of the shape are constant

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if not c.path:
            raise ValueError("custom-mesh needs geometry.path: the .obj/.glb file whose texture is optimized")
        if not c.texture_type:
            raise ValueError("custom-mesh needs a texture field (geometry.texture_type, e.g. hash-grid-texture)")
        mesh, self.file_frame = load_mesh_in_frame(c.path, normalize=c.normalize, half_extent=c.half_extent,
                                                   up_axis=c.up_axis, front_axis=c.front_axis,
                                                   uv_without_texture=c.keep_uvs)  # exports go back to it
        self.register_buffer("vertices", mesh.vertices, persistent=False)
        self.register_buffer("faces", mesh.faces, persistent=False)
        has_uv = mesh.uv is not None
        self.register_buffer("file_uv", mesh.uv, persistent=False)
        self.register_buffer("file_uv_faces", (mesh.uv_faces if mesh.uv_faces is not None else mesh.faces) if has_uv else None,
                             persistent=False)
        texture = mesh.texture[..., :3] if has_uv and mesh.texture is not None else None
        self.register_buffer("file_texture", texture, persistent=False)  # [H, W, 3] in 0..1: where the texture starts
        self.texture = find(c.texture_type)(c.texture)
        self._mesh: Mesh | None = None

    def forward(self) -> Mesh:
        """The mesh (cached per device; positions carry no gradient)."""
        if self._mesh is None or self._mesh.vertices.device != self.vertices.device:
            self._mesh = Mesh(self.vertices, self.faces)
        return self._mesh

    def uv_layout(self) -> tuple[Tensor, Tensor, Tensor] | None:
        """The file's UV layout for exports, split at its seams: (vertex index [U], uvs [U, 2], faces [F, 3] over U);
        None without UVs or with keep_uvs off."""
        if self.file_uv is None or not self.cfg.keep_uvs:
            return None
        pairs = torch.stack([self.faces.reshape(-1), self.file_uv_faces.reshape(-1)], dim=1)  # (vertex, uv) per corner
        unique, corner_to_unique = torch.unique(pairs, dim=0, return_inverse=True)
        return unique[:, 0], self.file_uv[unique[:, 1]], corner_to_unique.reshape(-1, 3)

    @torch.no_grad()
    def texture_samples(self, n: int, seed: int = 0) -> tuple[Tensor, Tensor] | None:
        """``n`` surface points [n, 3] (area-weighted) with the file's texture color there [n, 3]; None when the
        file has no texture. A texturing stage fits its texture field to them before distilling."""
        if self.file_texture is None:
            return None
        vertices, faces = self.vertices.cpu(), self.faces.cpu()
        draws = surface_samples(vertices, faces, n, seed)
        points = interpolate_corners(vertices[faces], *draws)
        uv = interpolate_corners(self.file_uv.cpu()[self.file_uv_faces.cpu()], *draws) % 1.0  # repeat, as viewers wrap
        image = self.file_texture.cpu().permute(2, 0, 1)[None].float()  # [1, 3, H, W], row 0 at the top (v = 1)
        grid = torch.stack([uv[:, 0] * 2 - 1, (1 - uv[:, 1]) * 2 - 1], dim=-1)[None, None]  # [1, 1, n, 2]
        colors = torch.nn.functional.grid_sample(image, grid, mode="bilinear", align_corners=False)[0, :, 0].T
        return points.to(self.vertices), colors.clamp(0, 1).to(self.vertices)

    def isosurface(self) -> Mesh:
        return self()

    def color(self, points: Tensor) -> Tensor:
        """Texture features [N, C] at surface ``points`` [N, 3]."""
        return self.texture(points)

    def sdf_regularizer(self) -> Tensor:
        return self.vertices.new_zeros(())

    @torch.no_grad()
    def bounds(self) -> Tensor:
        """[2, 3] the mesh's bounding box."""
        return torch.stack([self.vertices.min(0).values, self.vertices.max(0).values])
