"""Load a user's mesh (.obj, .glb, .gltf, .ply, ...) through trimesh as a ``Mesh`` for texturing stages:
welded positions, UVs with their own index buffer, the base-color texture, normalized to a box."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lift3d.meshes.mesh import Mesh


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


def _texture_image(visual) -> np.ndarray | None:
    """The base-color image of a trimesh TextureVisuals' material, as float [H, W, C] in 0..1."""
    material = getattr(visual, "material", None)
    image = None
    for name in ("baseColorTexture", "image"):
        image = getattr(material, name, None) if material is not None else None
        if image is not None:
            break
    if image is None:
        return None
    array = np.asarray(image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB"), dtype=np.float32) / 255.0
    return array


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
) -> tuple[Mesh, FileFrame]:
    """Read a mesh file into a ``Mesh`` (float32, CPU) and the ``FileFrame`` that placed it.

    With ``normalize`` the bounding box is centered at the origin and scaled so its largest half side is
    ``half_extent`` (0.5: the unit box). Vertices split by trimesh at UV seams are welded back by
    position (so the surface stays closed for rendering and regularizers) while UVs keep their own
    index buffer. ``texture_path`` supplies (or overrides) the texture image, e.g. for an OBJ without
    an .mtl file.
    """
    import trimesh  # a core dependency; imported here to keep ``import lift3d`` light

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mesh file not found: {path}")
    try:
        loaded = trimesh.load(str(path), force="mesh", process=False)
    except Exception as error:
        raise ValueError(f"could not read {path} as a mesh with trimesh: {error}") from None
    if not isinstance(loaded, trimesh.Trimesh) or len(loaded.faces) == 0:
        raise ValueError(f"{path} holds no triangles")
    rotation = axis_rotation(up_axis, front_axis)
    positions = np.asarray(loaded.vertices, dtype=np.float64) @ rotation.T
    split_faces = np.asarray(loaded.faces, dtype=np.int64)

    welded, inverse = np.unique(positions, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    faces = inverse[split_faces]
    center, scale = np.zeros(3), 1.0
    if normalize:
        low, high = welded.min(0), welded.max(0)
        center, scale = (low + high) / 2, half_extent / max((high - low).max() / 2, 1e-12)
        welded = (welded - center) * scale

    visual = loaded.visual
    uv = getattr(visual, "uv", None) if getattr(visual, "kind", None) == "texture" else None
    texture = _texture_image(visual) if uv is not None else None
    if texture_path is not None:
        from PIL import Image

        with Image.open(texture_path) as image:
            texture = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    vertex_colors = None
    if getattr(visual, "kind", None) == "vertex":
        colors = np.asarray(visual.vertex_colors, dtype=np.float32)[:, :3] / 255.0
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
        uv_faces=tensor(split_faces if uv is not None else None, torch.long),
        texture=tensor(texture, torch.float32),
        vertex_colors=tensor(vertex_colors, torch.float32),
    ), frame
