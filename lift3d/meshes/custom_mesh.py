"""A user's mesh as the geometry of a texturing stage (threestudio's ``custom-mesh``): the shape is
fixed, only its texture field is optimised against the prompt.

The file (.obj, .glb, .gltf, .ply, ... through trimesh) is read once, normalised into a box and
rotated into lift3d's frame (+z up, front towards +x). Its vertices and faces are buffers rebuilt
from the file, so checkpoints hold only the texture field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.meshes.io import load_mesh
from lift3d.meshes.mesh import Mesh
from lift3d.registry import find, register


@dataclass
class CustomMeshConfig:
    path: str = ""  # the mesh file (.obj, .glb, .gltf, .ply, ...)
    normalize: bool = True  # centre the bounding box at the origin and scale its largest half side to half_extent
    half_extent: float = 0.5  # half side of the normalised box, scene units
    up_axis: str = "+y"  # the file's up axis (+y for glTF and most OBJ exports), mapped to world +z
    front_axis: str = "+z"  # the file's front axis, mapped to world +x (seen by the camera at azimuth 0)
    texture_type: str = "hash-grid-texture"  # registered texture field, forward(points [N, 3]) -> features [N, C]
    texture: dict = field(default_factory=dict)  # the texture field's config


@register("custom-mesh")
class CustomMeshGeometry(BaseModule):
    """A fixed triangle mesh from a file with a learned texture field; ``forward()`` gives the mesh."""

    Config = CustomMeshConfig
    fixed_geometry = True  # no trainable shape: the regularisers of the shape are constant

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if not c.path:
            raise ValueError("custom-mesh needs geometry.path: the .obj/.glb file whose texture is optimised")
        if not c.texture_type:
            raise ValueError("custom-mesh needs a texture field (geometry.texture_type, e.g. hash-grid-texture)")
        mesh = load_mesh(c.path, normalize=c.normalize, half_extent=c.half_extent, up_axis=c.up_axis, front_axis=c.front_axis)
        self.register_buffer("vertices", mesh.vertices, persistent=False)
        self.register_buffer("faces", mesh.faces, persistent=False)
        self.texture = find(c.texture_type)(c.texture)
        self._mesh: Mesh | None = None

    def forward(self) -> Mesh:
        """The mesh (cached per device; positions carry no gradient)."""
        if self._mesh is None or self._mesh.vertices.device != self.vertices.device:
            self._mesh = Mesh(self.vertices, self.faces)
        return self._mesh

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
