"""Mesh files written the way other tools write them, for the mesh loading tests: glTF 2.0 assembled by hand (JSON,
a binary buffer, images embedded in a buffer view or beside the file, as Khronos' sample models are) and OBJ + MTL
+ texture as Blender writes them. None of them goes through lift3d's own writers.

Every model is a box of half side 1 centered at the origin (glTF axes: +y up, +z front); each of its six faces
maps the whole texture, so the front face (+z) seen from the front shows the texture upright.
"""

from __future__ import annotations

import base64
import io
import json
import struct
from pathlib import Path

import numpy as np
from PIL import Image

# the quadrant colors of ``quadrant_texture`` (top-left, top-right, bottom-left, bottom-right as seen in the image)
QUADRANTS = {"top_left": (230, 30, 30), "top_right": (30, 200, 40), "bottom_left": (40, 60, 220), "bottom_right": (240, 220, 30)}

# per face: (outward normal, image-right direction, image-up direction)
_FACES = [((0, 0, 1), (1, 0, 0), (0, 1, 0)), ((0, 0, -1), (-1, 0, 0), (0, 1, 0)), ((1, 0, 0), (0, 0, -1), (0, 1, 0)),
          ((-1, 0, 0), (0, 0, 1), (0, 1, 0)), ((0, 1, 0), (1, 0, 0), (0, 0, -1)), ((0, -1, 0), (1, 0, 0), (0, 0, 1))]


def quadrant_texture(size: int = 64, alpha: int | None = None) -> Image.Image:
    """An RGB (or RGBA with constant ``alpha``) image with four colored quadrants (``QUADRANTS``)."""
    half = size // 2
    pixels = np.zeros((size, size, 3), np.uint8)
    pixels[:half, :half], pixels[:half, half:] = QUADRANTS["top_left"], QUADRANTS["top_right"]
    pixels[half:, :half], pixels[half:, half:] = QUADRANTS["bottom_left"], QUADRANTS["bottom_right"]
    if alpha is None:
        return Image.fromarray(pixels, "RGB")
    return Image.fromarray(np.concatenate([pixels, np.full((size, size, 1), alpha, np.uint8)], -1), "RGBA")


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def box_arrays() -> dict[str, np.ndarray]:
    """The box's 24 vertices (4 per face): POSITION, NORMAL, TEXCOORD_0 (glTF's: (0, 0) is the image's top left)
    and 36 uint16 indices, counter-clockwise seen from outside."""
    positions, normals, uvs, indices = [], [], [], []
    for n, (normal, right, up) in enumerate(_FACES):
        normal, right, up = (np.array(v, np.float32) for v in (normal, right, up))
        for du, dv in ((-1, -1), (1, -1), (1, 1), (-1, 1)):  # bottom-left, bottom-right, top-right, top-left
            positions.append(normal + du * right + dv * up)
            normals.append(normal)
            uvs.append(((du + 1) / 2, (1 - dv) / 2))
        base = 4 * n
        indices += [base, base + 1, base + 2, base, base + 2, base + 3]
    return {"POSITION": np.array(positions, np.float32), "NORMAL": np.array(normals, np.float32),
            "TEXCOORD_0": np.array(uvs, np.float32), "indices": np.array(indices, np.uint16)}


class _Buffer:
    """Accumulates binary chunks with their buffer views and accessors, 4-byte aligned as glTF requires."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.views: list[dict] = []
        self.accessors: list[dict] = []

    def view(self, payload: bytes, target: int | None = None) -> int:
        while len(self.data) % 4:
            self.data.append(0)
        view = {"buffer": 0, "byteOffset": len(self.data), "byteLength": len(payload)}
        if target is not None:
            view["target"] = target
        self.data += payload
        self.views.append(view)
        return len(self.views) - 1

    def accessor(self, array: np.ndarray, kind: str, normalized: bool = False) -> int:
        component = {np.float32: 5126, np.uint16: 5123, np.uint8: 5121}[array.dtype.type]
        target = 34963 if kind == "SCALAR" else 34962
        accessor = {"bufferView": self.view(array.tobytes(), target), "componentType": component, "count": len(array),
                    "type": kind}
        if normalized:
            accessor["normalized"] = True
        if kind == "VEC3" and array.dtype == np.float32:
            accessor["min"], accessor["max"] = array.min(0).tolist(), array.max(0).tolist()
        self.accessors.append(accessor)
        return len(self.accessors) - 1


def box_document(texture: bytes | str | None = None, base_color_factor: list[float] | None = None,
                 vertex_colors: np.ndarray | None = None, alpha_mode: str | None = None) -> tuple[dict, bytes]:
    """The glTF JSON and binary buffer of the box: ``texture`` is PNG bytes (embedded in a buffer view) or an
    image URI (a file beside the .gltf), else none; ``base_color_factor`` an RGBA factor; ``vertex_colors``
    [24, 4] uint8 as a normalized COLOR_0 attribute."""
    arrays, buffer = box_arrays(), _Buffer()
    attributes = {"POSITION": buffer.accessor(arrays["POSITION"], "VEC3"), "NORMAL": buffer.accessor(arrays["NORMAL"], "VEC3")}
    if texture is not None:
        attributes["TEXCOORD_0"] = buffer.accessor(arrays["TEXCOORD_0"], "VEC2")
    if vertex_colors is not None:
        attributes["COLOR_0"] = buffer.accessor(np.asarray(vertex_colors, np.uint8), "VEC4", normalized=True)
    primitive = {"attributes": attributes, "indices": buffer.accessor(arrays["indices"], "SCALAR"), "mode": 4}
    document: dict = {"asset": {"version": "2.0", "generator": "hand-written test sample"}, "scene": 0,
                      "scenes": [{"nodes": [0]}], "nodes": [{"mesh": 0, "name": "Box"}],
                      "meshes": [{"primitives": [primitive], "name": "Box"}]}
    pbr: dict = {"metallicFactor": 0.0}
    if base_color_factor is not None:
        pbr["baseColorFactor"] = list(base_color_factor)
    if texture is not None:
        image = ({"bufferView": buffer.view(texture), "mimeType": "image/png"} if isinstance(texture, bytes)
                 else {"uri": texture})
        document.update(images=[image], samplers=[{"magFilter": 9729, "minFilter": 9986, "wrapS": 10497, "wrapT": 10497}],
                        textures=[{"sampler": 0, "source": 0}])
        pbr["baseColorTexture"] = {"index": 0}
    if texture is not None or base_color_factor is not None:
        material = {"pbrMetallicRoughness": pbr, "name": "Texture"}
        if alpha_mode is not None:
            material["alphaMode"] = alpha_mode
        document["materials"] = [material]
        primitive["material"] = 0
    while len(buffer.data) % 4:
        buffer.data.append(0)
    document.update(bufferViews=buffer.views, accessors=buffer.accessors, buffers=[{"byteLength": len(buffer.data)}])
    return document, bytes(buffer.data)


def write_glb(path: Path, document: dict, binary: bytes) -> Path:
    """A binary glTF: 12-byte header, the JSON chunk padded with spaces, the BIN chunk padded with zeros."""
    text = json.dumps(document, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 4)
    binary += b"\0" * (-len(binary) % 4)
    chunks = struct.pack("<II", len(text), 0x4E4F534A) + text + struct.pack("<II", len(binary), 0x004E4942) + binary
    Path(path).write_bytes(struct.pack("<III", 0x46546C67, 2, 12 + len(chunks)) + chunks)
    return Path(path)


def write_gltf(path: Path, document: dict, binary: bytes, buffer_uri: str | None = None) -> Path:
    """A .gltf: the buffer in a file ``buffer_uri`` beside it, or inline as a base64 data URI when None."""
    path = Path(path)
    if buffer_uri is None:
        document["buffers"][0]["uri"] = "data:application/octet-stream;base64," + base64.b64encode(binary).decode()
    else:
        (path.parent / buffer_uri).write_bytes(binary)
        document["buffers"][0]["uri"] = buffer_uri
    path.write_text(json.dumps(document, indent=2))
    return path


def write_textured_obj(folder: Path, texture: Image.Image, name: str = "box") -> Path:
    """``name``.obj + ``name``.mtl + ``name``_albedo.png the way Blender's OBJ exporter writes them (mtllib, usemtl,
    ``map_Kd``, 1-based ``f v/vt/vn``); the OBJ's texture coordinates have (0, 0) at the image's bottom left."""
    folder = Path(folder)
    arrays = box_arrays()
    texture.save(folder / f"{name}_albedo.png")
    (folder / f"{name}.mtl").write_text(
        "# Blender MTL File\nnewmtl Material\nNs 250.0\nKa 1.0 1.0 1.0\nKd 0.8 0.8 0.8\nKs 0.5 0.5 0.5\nd 1.0\nillum 2\n"
        f"map_Kd {name}_albedo.png\n")
    lines = ["# Blender OBJ File", f"mtllib {name}.mtl", "o Box"]
    lines += [f"v {x:.6f} {y:.6f} {z:.6f}" for x, y, z in arrays["POSITION"]]
    lines += [f"vt {u:.6f} {1 - v:.6f}" for u, v in arrays["TEXCOORD_0"]]
    lines += [f"vn {x:.4f} {y:.4f} {z:.4f}" for x, y, z in arrays["NORMAL"]]
    lines += ["usemtl Material", "s 0"]
    for a, b, c in arrays["indices"].reshape(-1, 3) + 1:
        lines.append(f"f {a}/{a}/{a} {b}/{b}/{b} {c}/{c}/{c}")
    (folder / f"{name}.obj").write_text("\n".join(lines) + "\n")
    return folder / f"{name}.obj"


def add_flat_box(document: dict, translation: list[float], scale: float, base_color_factor: list[float]) -> dict:
    """A second node drawing the same box (its POSITION, NORMAL and indices accessors shared, as glTF allows) moved by
    ``translation``, scaled by ``scale``, with a material of only a baseColorFactor: a textured and a flat part in
    one file, as in Khronos' CesiumMilkTruck."""
    first = document["meshes"][0]["primitives"][0]
    attributes = {key: first["attributes"][key] for key in ("POSITION", "NORMAL")}
    document.setdefault("materials", []).append({"pbrMetallicRoughness": {"baseColorFactor": list(base_color_factor),
                                                                          "metallicFactor": 0.0}, "name": "Flat"})
    document["meshes"].append({"primitives": [{"attributes": attributes, "indices": first["indices"], "mode": 4,
                                               "material": len(document["materials"]) - 1}], "name": "FlatBox"})
    document["nodes"].append({"mesh": len(document["meshes"]) - 1, "translation": list(translation),
                              "scale": [scale] * 3, "name": "FlatBox"})
    document["scenes"][0]["nodes"].append(len(document["nodes"]) - 1)
    return document
