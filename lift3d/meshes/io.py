"""Load a user's mesh (.obj, .glb, .gltf, .ply, ...) as a ``Mesh`` for texturing stages and the viewer: welded
positions, UVs with their own index buffer, the base-color texture or vertex colors (``mesh_files``), normalized
to a box."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lift3d.meshes.mesh import Mesh
from lift3d.meshes.mesh_files import image_rgb, read_mesh_file


@dataclass(frozen=True)
class FileFrame:
    """How a mesh file's coordinates became lift3d's: world = (rotation @ p - center) * scale. Exports of a user's
    mesh apply the inverse, so they overlay the input file exactly."""

    rotation: np.ndarray  # [3, 3] the file's up/front axes to world +z/+x
    center: np.ndarray  # [3] the rotated bounding box's center (zero when not normalized)
    scale: float  # 1 when not normalized

    def to_file(self, points: np.ndarray) -> np.ndarray:
        """World points [N, 3] back in the file's coordinates."""
        return (np.asarray(points, np.float64) / self.scale + self.center) @ self.rotation

    def directions_to_file(self, directions: np.ndarray) -> np.ndarray:
        """World directions [N, 3] (normals) in the file's axes."""
        return np.asarray(directions, np.float64) @ self.rotation


_AXES = {"+x": (1, 0, 0), "-x": (-1, 0, 0), "+y": (0, 1, 0), "-y": (0, -1, 0), "+z": (0, 0, 1), "-z": (0, 0, -1)}
AXES = tuple(_AXES)  # the names a mesh file's up and front axes take


def axis_rotation(up_axis: str = "+y", front_axis: str = "+z") -> np.ndarray:
    """Rotation [3, 3] taking the file's ``up_axis`` to world +z and its ``front_axis`` to world +x
    (so the camera at azimuth 0 sees the front). glTF files are +y up, +z front."""
    if up_axis not in _AXES or front_axis not in _AXES:
        raise ValueError(f"axes must be one of {sorted(_AXES)}, got up={up_axis!r}, front={front_axis!r}")
    up, front = np.array(_AXES[up_axis], float), np.array(_AXES[front_axis], float)
    if abs(up @ front) > 0:
        raise ValueError(f"up_axis {up_axis} and front_axis {front_axis} must be perpendicular")
    return np.stack([front, np.cross(up, front), up])


def load_mesh(path: str | Path, texture_path: str | Path | None = None, **placement: Any) -> Mesh:
    """Read a mesh file into a ``Mesh``: ``load_mesh_in_frame`` (whose keywords ``placement`` takes: normalize,
    half_extent, up_axis, front_axis) without the frame that placed it."""
    return load_mesh_in_frame(path, texture_path, **placement)[0]


def load_mesh_in_frame(
    path: str | Path,
    texture_path: str | Path | None = None,
    normalize: bool = True,
    half_extent: float = 0.5,
    up_axis: str = "+y",
    front_axis: str = "+z",
    uv_without_texture: bool = False,
    weld: bool = True,
) -> tuple[Mesh, FileFrame]:
    """Read a mesh file into a ``Mesh`` (float32, CPU) and the ``FileFrame`` that placed it.

    With ``normalize`` the bounding box is centered at the origin and scaled so its largest half side is
    ``half_extent`` (0.5: the unit box). With ``weld``, vertices split by the file at UV or color seams are welded
    back by position (so the surface stays closed for rendering and regularizers) while UVs keep their own index
    buffer; without it (for drawing only) every corner keeps its own vertex, so per-face vertex colors stay sharp.
    Colors come from the base-color texture (times a glTF baseColorFactor), else the factor alone, else vertex
    colors. ``texture_path`` supplies (or overrides) the texture image, e.g. for an OBJ without an .mtl file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mesh file not found: {path}")
    positions, split_faces, uv, texture, colors = read_mesh_file(path)
    rotation = axis_rotation(up_axis, front_axis)
    positions = positions @ rotation.T

    if weld:
        welded, inverse = np.unique(positions, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
    else:
        welded, inverse = positions, np.arange(len(positions))
    faces = inverse[split_faces]
    center, scale = np.zeros(3), 1.0
    if normalize:
        low, high = welded.min(0), welded.max(0)
        center, scale = (low + high) / 2, half_extent / max((high - low).max() / 2, 1e-12)
        welded = (welded - center) * scale

    if texture_path is not None:
        from lift3d.imaging import open_image
        from lift3d.limits import TEXTURE_PIXELS

        try:
            with open_image(texture_path, str(texture_path), ValueError, TEXTURE_PIXELS) as image:
                texture = image_rgb(image)
        except OSError as error:
            raise ValueError(f"could not read the texture {texture_path}: {error}") from None
    vertex_colors = None
    if colors is not None:
        vertex_colors = np.zeros((len(welded), 3), dtype=np.float32)
        vertex_colors[inverse] = colors

    def tensor(a: np.ndarray | None, dtype: torch.dtype) -> Tensor | None:
        return None if a is None else torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)

    if uv is not None and texture is None and not uv_without_texture:
        uv = None  # UVs without a texture are of no use to the renderer (a texturing stage may bake into them)
    frame = FileFrame(rotation, center, float(scale))
    return Mesh(
        vertices=tensor(welded, torch.float32),
        faces=tensor(faces, torch.long),
        uv=tensor(None if uv is None else np.asarray(uv, np.float64), torch.float32),
        uv_faces=tensor(split_faces if uv is not None and weld else None, torch.long),
        texture=tensor(texture, torch.float32),
        vertex_colors=tensor(vertex_colors, torch.float32),
    ), frame
