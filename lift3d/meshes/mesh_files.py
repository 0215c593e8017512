"""Read a mesh file (.glb, .gltf, .obj + .mtl, .ply, ...) with trimesh into one triangle mesh whose colors are what a
viewer shows: a base-color texture, or per-vertex colors, in sRGB.

glTF's base color is ``baseColorFactor`` (linear) times ``baseColorTexture`` (sRGB) times ``COLOR_0`` (linear); the
factor and the vertex colors are turned into sRGB here, so the renderer draws every file's colors as they are
stored in an image. An OBJ's ``map_Kd`` texture is used as it is (its ``Kd`` beside a texture left out, as most
viewers do); ``Kd`` alone colors the surface. Several primitives (with their node transforms) are joined into one
mesh: textures into one atlas (trimesh packs them), a primitive with one flat color into a small texture beside them.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GLTF_SUFFIXES = (".glb", ".gltf")


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """sRGB values in 0..1 -> linear (the IEC 61966-2-1 curve)."""
    c = np.clip(c, 0.0, 1.0)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(c: np.ndarray) -> np.ndarray:
    """Linear values in 0..1 -> sRGB: what a glTF viewer shows for a linear color."""
    c = np.clip(c, 0.0, 1.0)
    return np.where(c <= 0.0031308, c * 12.92, 1.055 * c ** (1 / 2.4) - 0.055)


def image_rgb(image) -> np.ndarray:
    """A PIL image of any mode (RGBA, palette, gray) as float RGB [H, W, 3] in 0..1; alpha is left out (the mesh
    renderer draws opaque surfaces)."""
    return np.asarray(image.convert("RGBA").convert("RGB") if image.mode == "P" else image.convert("RGB"), np.float32) / 255.0


@dataclass
class _Part:
    """One primitive in world coordinates with its colors as shown (sRGB in 0..1)."""

    vertices: np.ndarray  # [V, 3]
    faces: np.ndarray  # [F, 3]
    uv: np.ndarray | None = None  # [V, 2], (0, 0) at the image's bottom left
    texture: np.ndarray | None = None  # [H, W, 3]
    colors: np.ndarray | None = None  # [V, 3]

    def flat_color(self) -> np.ndarray | None:
        """The part's one color when every vertex has the same (e.g. a glTF material with only a baseColorFactor)."""
        if self.colors is not None and np.ptp(self.colors, axis=0).max() < 1e-6:
            return self.colors[0]
        return None


def _part(geometry, transform: np.ndarray, linear: bool) -> _Part:
    """A trimesh geometry placed by its node ``transform``, with its colors turned into sRGB (``linear``: glTF)."""
    vertices = np.asarray(geometry.vertices, np.float64) @ transform[:3, :3].T + transform[:3, 3]
    faces = np.asarray(geometry.faces, np.int64)
    if np.linalg.det(transform[:3, :3]) < 0:  # a mirroring node keeps its triangles facing out
        faces = faces[:, ::-1]
    part, visual = _Part(vertices, faces), geometry.visual
    if getattr(visual, "kind", None) == "face":  # one color per face (PLY): every corner its own vertex, so it stays sharp
        colors = np.repeat(np.asarray(visual.face_colors, np.float32)[:, :3] / 255.0, 3, axis=0)
        return _Part(vertices[faces].reshape(-1, 3), np.arange(3 * len(faces)).reshape(-1, 3), colors=colors)
    if getattr(visual, "kind", None) == "vertex":
        colors = np.asarray(visual.vertex_colors, np.float32)[:, :3] / 255.0
        part.colors = linear_to_srgb(colors) if linear else colors
        return part
    material = getattr(visual, "material", None)
    if material is None:
        return part
    image = getattr(material, "baseColorTexture", None)
    image = getattr(material, "image", None) if image is None else image  # OBJ's map_Kd (trimesh's SimpleMaterial)
    factor = getattr(material, "baseColorFactor", None)  # glTF (trimesh keeps it as uint8 RGBA)
    factor = None if factor is None else np.asarray(factor)[:3].astype(np.float64) / 255.0
    uv = getattr(visual, "uv", None)
    part.uv = None if uv is None else np.asarray(uv, np.float64)  # kept without a texture too: a stage may bake into it
    if image is not None and uv is not None:
        texture = image_rgb(image)
        if factor is not None and (factor < 1).any():
            texture = linear_to_srgb(srgb_to_linear(texture) * factor) if linear else texture * factor
        part.texture = texture.astype(np.float32)
        return part
    color0 = dict(getattr(visual, "vertex_attributes", {}) or {}).get("color")  # glTF COLOR_0 beside a material
    if color0 is not None and len(color0) == len(vertices):
        colors = np.asarray(color0, np.float64)[:, :3]
        colors = colors / 255.0 if np.asarray(color0).dtype == np.uint8 else colors
        colors = colors * (1.0 if factor is None else factor)
    elif factor is not None:
        colors = np.broadcast_to(factor, (len(vertices), 3))
    elif not linear and getattr(material, "diffuse", None) is not None:  # an OBJ's Kd without a texture
        colors = np.broadcast_to(np.asarray(material.diffuse)[:3] / 255.0, (len(vertices), 3))
    else:
        return part
    part.colors = (linear_to_srgb(colors) if linear else np.asarray(colors)).astype(np.float32)
    return part


class _UnreadImages(logging.Handler):
    """Collects what trimesh says (at debug level, with the exception) when it cannot read a texture image, which it
    otherwise skips in silence."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "image" in record.getMessage() and record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            missing = isinstance(error, FileNotFoundError)
            self.reasons.append(f"{error} is missing" if missing else f"{type(error).__name__}: {str(error).splitlines()[0]}")


def _load_scene(path: Path):
    """``trimesh.load`` as a scene; a file it cannot read is a ValueError of one line, and a texture image it skips
    (missing beside the file, not an image) a warning naming it."""
    import trimesh  # a core dependency; imported here to keep ``import lift3d`` light

    from lift3d.meshes.texture_limits import check_textures

    check_textures(path)
    logger, handler = logging.getLogger("trimesh"), _UnreadImages()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        scene = trimesh.load(str(path), force="scene", process=False)
    except FileNotFoundError as error:
        raise ValueError(f"{path.name} refers to {error.args[0] if error.args else error}, which is not in {path.parent}: "
                         "put the file it names beside it (or export the model as one .glb)") from None
    except Exception as error:  # noqa: BLE001  (trimesh raises many kinds for a damaged or foreign file)
        reason = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"could not read {path} as a mesh (is it complete, and a mesh file?): {reason}") from None
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    for reason in dict.fromkeys(handler.reasons):
        warnings.warn(f"{path}: a texture image could not be read ({reason}); the mesh is drawn without it", stacklevel=4)
    return scene


def _as_trimesh(part: _Part, texture: np.ndarray | None = None, uv: np.ndarray | None = None):
    import trimesh
    from PIL import Image

    texture, uv = (part.texture, part.uv) if texture is None else (texture, uv)
    mesh = trimesh.Trimesh(part.vertices, part.faces, process=False)
    if texture is not None:
        image = Image.fromarray((np.clip(texture, 0, 1) * 255 + 0.5).astype(np.uint8))
        mesh.visual = trimesh.visual.TextureVisuals(uv=uv, material=trimesh.visual.material.PBRMaterial(baseColorTexture=image))
    elif part.colors is not None:
        mesh.visual = trimesh.visual.ColorVisuals(mesh, vertex_colors=(np.clip(part.colors, 0, 1) * 255 + 0.5).astype(np.uint8))
    return mesh


def _join(parts: list[_Part]) -> _Part:
    """One part of several: their textures packed into one atlas by trimesh (a flat-colored part becomes a 4x4
    texture, so bilinear lookups at its center see no neighbor), or their vertex colors side by side (a part without
    colors is drawn gray)."""
    import trimesh

    textured = [p.texture is not None for p in parts]
    if any(textured) and all(t or p.flat_color() is not None for t, p in zip(textured, parts)):
        meshes = [_as_trimesh(p) if t else _as_trimesh(p, np.broadcast_to(p.flat_color(), (4, 4, 3)),
                                                      np.full((len(p.vertices), 2), 0.5)) for t, p in zip(textured, parts)]
        joined = trimesh.util.concatenate(meshes)
        return _Part(np.asarray(joined.vertices), np.asarray(joined.faces), np.asarray(joined.visual.uv, np.float64),
                     image_rgb(joined.visual.material.baseColorTexture))
    colors = []
    for part in parts:  # vertex colors of a textured part: its texture at each vertex (trimesh samples it)
        if part.texture is not None:
            sampled = _as_trimesh(part).visual.to_color().vertex_colors
            colors.append(np.asarray(sampled, np.float32)[:, :3] / 255.0)
        else:
            colors.append(part.colors if part.colors is not None else np.full((len(part.vertices), 3), 0.8, np.float32))
    offsets = np.cumsum([0] + [len(p.vertices) for p in parts])[:-1]
    any_colors = any(p.colors is not None or p.texture is not None for p in parts)
    return _Part(np.concatenate([p.vertices for p in parts]), np.concatenate([p.faces + o for p, o in zip(parts, offsets)]),
                 colors=np.concatenate(colors) if any_colors else None)


def read_mesh_file(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None,
                                                 np.ndarray | None]:
    """Every triangle of the file's scene (node transforms applied) as (vertices [V, 3], faces [F, 3], uv [V, 2] or
    None, texture [H, W, 3] sRGB or None, vertex colors [V, 3] sRGB or None), in the file's own axes. Corners split
    at UV or color seams stay split. A file trimesh cannot read, or one without triangles, is a ValueError."""
    import trimesh

    path = Path(path)
    scene = _load_scene(path)
    linear = path.suffix.lower() in GLTF_SUFFIXES
    parts = []
    for node in scene.graph.nodes_geometry:
        transform, name = scene.graph[node]
        geometry = scene.geometry.get(name)
        if isinstance(geometry, trimesh.Trimesh) and len(geometry.faces):
            parts.append(_part(geometry, np.asarray(transform, np.float64), linear))
    if not parts:
        raise ValueError(f"{path} holds no triangles")
    part = parts[0] if len(parts) == 1 else _join(parts)
    return part.vertices, part.faces, part.uv, part.texture, part.colors
