"""Mesh files: binary glTF (.glb, texture embedded), .obj + .mtl + texture PNG, .ply with vertex colors.

Axes: lift3d's world is +z up; glTF is +y up, and Blender imports .glb and .obj as +y up by default,
so with ``up_axis="y"`` (the default) points are rotated by -90 degrees about x, (x, y, z) ->
(x, z, -y), which a +y-up importer turns back into lift3d's frame. ``up_axis="z"`` writes them as is.

Colors: textures and .ply/.obj vertex colors are sRGB. glTF defines COLOR_0 as linear, so .glb
vertex colors are converted from sRGB to linear (8 bits, normalized) before writing.
"""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import trimesh
from PIL import Image
from plyfile import PlyData, PlyElement

from lift3d.meshes.mesh import Mesh
from lift3d.rotations import Z_UP_TO_Y_UP
from lift3d.saving import atomic_write_bytes

_Z_UP_TO_Y_UP = np.array(Z_UP_TO_Y_UP)


def oriented(mesh: Mesh, up_axis: str) -> Mesh:
    """The mesh (as numpy arrays) with points and normals in the file's frame (see the module docstring)."""
    mesh = mesh.numpy()
    if mesh.uv_faces is not None:
        raise ValueError("mesh files take one UV per vertex: split the mesh at its UV seams before writing it")
    if up_axis == "z":
        return mesh
    if up_axis != "y":
        raise ValueError(f"up_axis must be 'y' (glTF/Blender convention) or 'z' (lift3d's world as is), got {up_axis!r}")
    normals = None if mesh.normals is None else mesh.normals @ _Z_UP_TO_Y_UP.T
    return replace(mesh, vertices=mesh.vertices @ _Z_UP_TO_Y_UP.T, normals=normals)


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """sRGB values in 0..1 -> linear values in 0..1 (the IEC 61966-2-1 curve)."""
    c = np.clip(c, 0.0, 1.0)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _to_uint8(c: np.ndarray) -> np.ndarray:
    return (np.clip(c, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _rgba(c: np.ndarray) -> np.ndarray:
    rgb = _to_uint8(c)
    return np.concatenate([rgb, np.full((len(rgb), 1), 255, np.uint8)], axis=1)


def to_trimesh(mesh: Mesh, name: str = "lift3d", linear_vertex_colors: bool = False) -> trimesh.Trimesh:
    """A trimesh.Trimesh with the mesh's normals and either its texture (preferred) or vertex colors,
    and a matte PBR material (metallic 0, roughness 1: albedo only, as lift3d bakes it)."""
    out = trimesh.Trimesh(mesh.vertices, mesh.faces, process=False, validate=False)
    if mesh.normals is not None:
        out.vertex_normals = mesh.normals
    texture = None if mesh.texture is None else Image.fromarray(mesh.texture)
    material = trimesh.visual.material.PBRMaterial(
        name=name, baseColorTexture=texture, metallicFactor=0.0, roughnessFactor=1.0, doubleSided=False
    )
    if mesh.texture is not None:
        out.visual = trimesh.visual.TextureVisuals(uv=mesh.uv, material=material)
    elif mesh.vertex_colors is not None:
        colors = srgb_to_linear(mesh.vertex_colors) if linear_vertex_colors else mesh.vertex_colors
        out.visual = trimesh.visual.TextureVisuals(material=material)
        out.visual.vertex_attributes["color"] = _rgba(colors)
    else:
        out.visual = trimesh.visual.TextureVisuals(material=material)
    return out


def write_glb(mesh: Mesh, path: str | Path, up_axis: str = "y") -> list[Path]:
    """One self-contained .glb (texture embedded as PNG); returns [path]."""
    path = Path(path)
    tm = to_trimesh(oriented(mesh, up_axis), name=path.stem, linear_vertex_colors=True)
    data = trimesh.exchange.gltf.export_glb(tm, include_normals=mesh.normals is not None)
    atomic_write_bytes(path, data)
    return [path]


def write_obj(mesh: Mesh, path: str | Path, up_axis: str = "y") -> list[Path]:
    """``name.obj`` with normals and UVs, plus ``name.mtl`` and ``name.png`` when the mesh has a texture
    (an untextured mesh's vertex colors go on the ``v`` lines, a common OBJ extension)."""
    path = Path(path)
    mesh = oriented(mesh, up_axis)
    written = []
    if mesh.texture is not None:
        tm = trimesh.Trimesh(mesh.vertices, mesh.faces, process=False, validate=False)
        if mesh.normals is not None:
            tm.vertex_normals = mesh.normals
        material = trimesh.visual.material.SimpleMaterial(
            name=path.stem, image=Image.fromarray(mesh.texture), diffuse=[255, 255, 255, 255],
            ambient=[255, 255, 255, 255], specular=[0, 0, 0, 255],
        )
        tm.visual = trimesh.visual.TextureVisuals(uv=mesh.uv, material=material)
        text, files = trimesh.exchange.obj.export_obj(
            tm, include_normals=mesh.normals is not None, include_texture=True, return_texture=True,
            mtl_name=f"{path.stem}.mtl",
        )
        # the texture is ``name.png`` whatever trimesh calls it (4.0 names it after the material's index)
        renames = {name: f"{path.stem}{Path(name).suffix}" for name in files if not name.endswith(".mtl")}
        for name, data in files.items():
            if name.endswith(".mtl"):
                for old, new in renames.items():
                    data = re.sub(rb"(map_\w+\s+)" + re.escape(old.encode()) + rb"\b", rb"\g<1>" + new.encode(), data)
            out = path.with_name(renames.get(name, name))
            atomic_write_bytes(out, data)
            written.append(out)
    else:
        tm = to_trimesh(mesh)
        if mesh.vertex_colors is not None:
            tm.visual = trimesh.visual.ColorVisuals(tm, vertex_colors=_rgba(mesh.vertex_colors))
        text = trimesh.exchange.obj.export_obj(tm, include_normals=mesh.normals is not None, include_texture=False)
    atomic_write_bytes(path, text.encode())
    return [path, *written]


def write_ply(mesh: Mesh, path: str | Path, up_axis: str = "y") -> list[Path]:
    """Binary .ply (plyfile): x y z, nx ny nz (if any), red green blue uchar (if any); faces as
    ``vertex_indices``."""
    path = Path(path)
    mesh = oriented(mesh, up_axis)
    fields = [("x", "f4"), ("y", "f4"), ("z", "f4")]
    if mesh.normals is not None:
        fields += [("nx", "f4"), ("ny", "f4"), ("nz", "f4")]
    if mesh.vertex_colors is not None:
        fields += [("red", "u1"), ("green", "u1"), ("blue", "u1")]
    vertices = np.empty(len(mesh.vertices), dtype=fields)
    for i, axis in enumerate("xyz"):
        vertices[axis] = mesh.vertices[:, i]
        if mesh.normals is not None:
            vertices[f"n{axis}"] = mesh.normals[:, i]
    if mesh.vertex_colors is not None:
        rgb = _to_uint8(mesh.vertex_colors)
        for i, channel in enumerate(("red", "green", "blue")):
            vertices[channel] = rgb[:, i]
    faces = np.empty(len(mesh.faces), dtype=[("vertex_indices", "i4", (3,))])
    faces["vertex_indices"] = mesh.faces.astype(np.int32)
    buffer = io.BytesIO()
    PlyData([PlyElement.describe(vertices, "vertex"), PlyElement.describe(faces, "face")], byte_order="<").write(buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return [path]
