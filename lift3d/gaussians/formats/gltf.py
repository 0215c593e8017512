"""Gaussians in binary glTF (.glb) with the Khronos ``KHR_gaussian_splatting`` extension, written and read here.

One mesh with one primitive of mode POINTS (0), one point per Gaussian, float32 attributes:

    POSITION                                   VEC3  the mean (with min/max, as glTF requires)
    COLOR_0                                    VEC4  unsigned byte normalized: clamp(0.5 + Y0 sh_dc) decoded
                                                     from sRGB to linear (glTF colors are linear), alpha = opacity;
                                                     the point-cloud fallback for viewers without the extension
    KHR_gaussian_splatting:ROTATION            VEC4  unit quaternion, glTF's xyzw order
    KHR_gaussian_splatting:SCALE               VEC3  linear standard deviations (exp of the log scale)
    KHR_gaussian_splatting:OPACITY             SCALAR 0..1 (the sigmoid of the logit)
    KHR_gaussian_splatting:SH_DEGREE_l_COEF_n  VEC3  RGB SH coefficient m = n - l of band l (l = 0..degree), in the
                                                     same real-SH basis (Condon-Shortley phase) as 3DGS, so no
                                                     sign changes

and the primitive's extension object ``{"kernel": "ellipse", "colorSpace": "srgb_rec709_display",
"projection": "perspective", "sortingMethod": "cameraDistance"}``; the extension is listed in
``extensionsUsed`` (not required: a viewer without it shows the colored points).

Axes: lift3d's Gaussian files hold the frame of 3DGS .ply files, right-down-front (as COLMAP-trained splats are,
and as the .spz conversion reads them); glTF is left-up-front (+y up, the asset's front facing +z and its left +x:
glTF 2.0, "Coordinate System and Units"), and the extension asks for data already in glTF's axes. With ``up_axis="y"``
(the default) the Gaussians are turned a half turn about z, (x, y, z) -> (-x, -y, z), positions, rotations and SH
alike, and the reader turns them back: the conversion PlayCanvas's splat-transform makes (and Niantic's
CoordinateSystem names: RDF "PLY", LUF "GLB"), so either tool's .glb of one .ply holds the same numbers.
``up_axis="world"`` is for Gaussians in lift3d's own world (+z up, as a run's are): they are turned as lift3d's
mesh .glb files are, (x, y, z) -> (x, z, -y), so they stand up in glTF viewers where the run's mesh does, and the
asset's ``extras`` record the turn (``{"lift3d": {"axes": "world"}}``) so the reader undoes exactly that one.
``up_axis="z"`` stores (and reads) the coordinates as they are.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.formats.codec import PlyFormatError, check_count, finite_gaussians, read_file, register_codec, write_file
from lift3d.gaussians.formats.ply import pruned
from lift3d.gaussians.transform import rotate_gaussians
from lift3d.rotations import Z_UP_TO_Y_UP  # lift3d's world to glTF's +y up, as lift3d.export.writers turns meshes
from lift3d.sh import Y0, degree_of

EXTENSION = "KHR_gaussian_splatting"
GLB_MAGIC, JSON_CHUNK, BIN_CHUNK = 0x46546C67, 0x4E4F534A, 0x004E4942
FLOAT, UNSIGNED_BYTE = 5126, 5121
WIDTHS = {"SCALAR": 1, "VEC3": 3, "VEC4": 4}
# right-down-front (the .ply frame) to glTF's left-up-front: a half turn about z, (x, y, z) -> (-x, -y, z)
PLY_TO_GLTF = ((-1.0, 0.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, 1.0))
AXES = {"y": PLY_TO_GLTF, "world": Z_UP_TO_Y_UP, "z": None}  # up_axis -> the turn into glTF's axes


class GltfSplatError(PlyFormatError):
    """A .glb that is not a readable KHR_gaussian_splatting file; the message says what is wrong."""


def _srgb_to_linear(c: np.ndarray) -> np.ndarray:
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _axes(up_axis: str) -> Tensor | None:
    if up_axis not in AXES:
        raise ValueError(f"up_axis must be 'y' (from the .ply frame to glTF's axes), 'world' (from lift3d's +z-up world) "
                         f"or 'z' (the coordinates as they are), got {up_axis!r}")
    turn = AXES[up_axis]
    return None if turn is None else torch.tensor(turn, dtype=torch.float64)


def encode_gltf_splat(params: dict[str, Tensor], up_axis: str = "y") -> bytes:
    """The .glb bytes of pre-activation Gaussian parameters (lift3d's world; see the module docstring)."""
    rotation = _axes(up_axis)
    params = {k: v.detach().float().cpu() for k, v in params.items()}
    if rotation is not None:
        params = rotate_gaussians(params, rotation)
    p = {k: v.numpy() for k, v in params.items()}
    n = len(p["means"])
    if n == 0:
        raise GltfSplatError("there are no Gaussians to write")
    degree = degree_of(p["shN"].shape[1] + 1)
    quats = p["quats"].astype(np.float64)
    quats = (quats / np.maximum(np.linalg.norm(quats, axis=1, keepdims=True), 1e-30))[:, [1, 2, 3, 0]]
    opacity = 1.0 / (1.0 + np.exp(-p["opacity_logits"].astype(np.float64)))
    rgb = _srgb_to_linear(np.clip(0.5 + Y0 * p["sh0"].reshape(n, 3), 0.0, 1.0))
    color = np.round(np.concatenate([rgb, opacity[:, None]], axis=1) * 255.0).astype(np.uint8)
    attributes: list[tuple[str, np.ndarray, str]] = [
        ("POSITION", p["means"], "VEC3"), ("COLOR_0", color, "VEC4"),
        (f"{EXTENSION}:ROTATION", quats, "VEC4"), (f"{EXTENSION}:SCALE", np.exp(p["log_scales"]), "VEC3"),
        (f"{EXTENSION}:OPACITY", opacity, "SCALAR"), (f"{EXTENSION}:SH_DEGREE_0_COEF_0", p["sh0"].reshape(n, 3), "VEC3"),
    ]
    for band in range(1, degree + 1):
        for m in range(2 * band + 1):
            attributes.append((f"{EXTENSION}:SH_DEGREE_{band}_COEF_{m}", p["shN"][:, band * band - 1 + m], "VEC3"))
    blob, views, accessors, semantics = bytearray(), [], [], {}
    for index, (semantic, values, kind) in enumerate(attributes):
        array = values if values.dtype == np.uint8 else values.astype("<f4")
        data = np.ascontiguousarray(array).tobytes()
        views.append({"buffer": 0, "byteOffset": len(blob), "byteLength": len(data)})
        blob += data + b"\0" * (-len(data) % 4)
        accessor = {"bufferView": index, "componentType": UNSIGNED_BYTE if array.dtype == np.uint8 else FLOAT,
                    "count": n, "type": kind}
        if array.dtype == np.uint8:
            accessor["normalized"] = True
        if semantic == "POSITION":
            accessor.update(min=array.min(0).tolist(), max=array.max(0).tolist())
        accessors.append(accessor)
        semantics[semantic] = index
    document = {
        "asset": {"version": "2.0", "generator": "lift3d",
                  **({"extras": {"lift3d": {"axes": "world"}}} if up_axis == "world" else {})},
        "extensionsUsed": [EXTENSION],
        "scene": 0, "scenes": [{"nodes": [0]}], "nodes": [{"mesh": 0, "name": "gaussians"}],
        "meshes": [{"name": "gaussians", "primitives": [{
            "attributes": semantics, "mode": 0,
            "extensions": {EXTENSION: {"kernel": "ellipse", "colorSpace": "srgb_rec709_display",
                                       "projection": "perspective", "sortingMethod": "cameraDistance"}},
        }]}],
        "buffers": [{"byteLength": len(blob)}], "bufferViews": views, "accessors": accessors,
    }
    text = json.dumps(document, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 4)
    total = 12 + 8 + len(text) + 8 + len(blob)
    return (struct.pack("<III", GLB_MAGIC, 2, total) + struct.pack("<II", len(text), JSON_CHUNK) + text
            + struct.pack("<II", len(blob), BIN_CHUNK) + bytes(blob))


def save_gltf_splat(path: str | Path, params: dict[str, Tensor], keep: Tensor | None = None, sh_degree: int | None = None,
                    up_axis: str = "y") -> Path:
    """Write pre-activation parameters as a KHR_gaussian_splatting .glb, atomically; ``keep`` [N] (bool) selects
    Gaussians, ``sh_degree`` cuts the SH bands."""
    return write_file(path, encode_gltf_splat(pruned(params, keep, sh_degree), up_axis))


def _chunks(data: bytes, name: str) -> tuple[dict, bytes]:
    if len(data) < 20:
        raise GltfSplatError(f"{name} is too short for a binary glTF ({len(data)} bytes)")
    magic, version, total = struct.unpack_from("<III", data)
    if magic != GLB_MAGIC or version != 2:
        raise GltfSplatError(f"{name} is not a binary glTF 2.0 file (.glb): magic {magic:#x}, version {version}")
    if total != len(data):
        raise GltfSplatError(f"{name} is truncated or corrupt: its header says {total} bytes, the file has {len(data)}")
    offset, document, blob = 12, None, b""
    while offset + 8 <= len(data):
        length, kind = struct.unpack_from("<II", data, offset)
        chunk = data[offset + 8: offset + 8 + length]
        if len(chunk) != length:
            raise GltfSplatError(f"{name} is truncated: a chunk of {length} bytes runs past the end")
        if kind == JSON_CHUNK:
            try:
                document = json.loads(chunk)
            except ValueError as error:
                raise GltfSplatError(f"{name}: its JSON chunk is not valid JSON ({error})") from None
        elif kind == BIN_CHUNK:
            blob = chunk
        offset += 8 + length
    if not isinstance(document, dict):
        raise GltfSplatError(f"{name} has no JSON chunk")
    return document, blob


def decode_gltf_splat(data: bytes, name: str = "the data", up_axis: str = "y") -> dict[str, Tensor]:
    """Pre-activation parameters (lift3d's world) of the first KHR_gaussian_splatting primitive of .glb bytes."""
    document, blob = _chunks(data, name)
    primitive = _gaussian_primitive(document)
    if primitive is None:
        raise GltfSplatError(f"{name} has no mesh primitive with the {EXTENSION} extension (a .glb of Gaussians needs one)")
    attributes = primitive["attributes"]

    def read(semantic: str, width: int) -> np.ndarray:
        if semantic not in attributes:
            raise GltfSplatError(f"{name}: the Gaussian primitive lacks the attribute {semantic}")
        try:
            accessor = document["accessors"][attributes[semantic]]
            view = document["bufferViews"][accessor["bufferView"]]
        except (KeyError, IndexError, TypeError):
            raise GltfSplatError(f"{name}: the accessor of {semantic} is missing or malformed") from None
        if accessor.get("componentType") != FLOAT or WIDTHS.get(accessor.get("type")) != width or "byteStride" in view:
            raise GltfSplatError(f"{name}: {semantic} is not tightly packed float32 {accessor.get('type')}; lift3d reads "
                                 "float attributes (quantized ones need KHR_mesh_quantization, which it does not read)")
        start, count = view.get("byteOffset", 0) + accessor.get("byteOffset", 0), accessor.get("count")
        if not isinstance(count, int) or not isinstance(start, int) or start < 0:
            raise GltfSplatError(f"{name}: the accessor of {semantic} is malformed (count {count!r}, offset {start!r})")
        check_count(count, name)
        count *= width
        if start + 4 * count > len(blob):
            raise GltfSplatError(f"{name} is truncated: {semantic} runs past the end of the binary chunk")
        values = np.frombuffer(blob, dtype="<f4", count=count, offset=start).reshape(-1, width).astype(np.float32)
        if counts and len(values) != counts[0]:
            raise GltfSplatError(f"{name}: {semantic} has {len(values):,} values, POSITION {counts[0]:,}; every attribute of "
                                 "the Gaussian primitive has one value per Gaussian")
        return values

    counts: list[int] = []
    means = read("POSITION", 3)
    n = len(means)
    counts.append(n)
    sh0 = read(f"{EXTENSION}:SH_DEGREE_0_COEF_0", 3)
    degree = 0
    while degree < 3 and f"{EXTENSION}:SH_DEGREE_{degree + 1}_COEF_0" in attributes:
        degree += 1
    rest = [read(f"{EXTENSION}:SH_DEGREE_{band}_COEF_{m}", 3) for band in range(1, degree + 1) for m in range(2 * band + 1)]
    opacity = np.clip(read(f"{EXTENSION}:OPACITY", 1)[:, 0].astype(np.float64), 1e-6, 1.0 - 1e-6)
    scales = read(f"{EXTENSION}:SCALE", 3)
    if (scales <= 0).any():  # NaN compares False: left to finite_gaussians
        raise GltfSplatError(f"{name}: {EXTENSION}:SCALE holds values <= 0; the extension stores linear scales (> 0)")
    params = {
        "means": torch.from_numpy(means),
        "log_scales": torch.from_numpy(np.log(scales)),
        "quats": torch.from_numpy(read(f"{EXTENSION}:ROTATION", 4)[:, [3, 0, 1, 2]].copy()),
        "opacity_logits": torch.from_numpy(np.log(opacity / (1.0 - opacity)).astype(np.float32)),
        "sh0": torch.from_numpy(sh0.reshape(n, 1, 3)),
        "shN": torch.from_numpy(np.stack(rest, axis=1)) if rest else torch.zeros(n, 0, 3),
    }
    rotation = _axes(up_axis if up_axis == "z" else _written_axes(document))
    return finite_gaussians(params if rotation is None else rotate_gaussians(params, rotation.T), name)


def _gaussian_primitive(document: dict) -> dict | None:
    """The first mesh primitive of a glTF document that uses KHR_gaussian_splatting (None: a mesh, not Gaussians)."""
    return next((prim for mesh in document.get("meshes", []) for prim in mesh.get("primitives", [])
                 if EXTENSION in (prim.get("extensions") or {})), None)


def is_gaussian_glb(path: str | Path) -> bool:
    """Whether the .glb at ``path`` holds Gaussians (a primitive with KHR_gaussian_splatting, what the reader takes)
    rather than a mesh; only its header and JSON chunk are read. An unreadable file is not Gaussians (False)."""
    with open(path, "rb") as handle:
        head = handle.read(20)
        if len(head) < 20 or head[:4] != b"glTF" or head[16:20] != b"JSON":
            return False
        try:
            return _gaussian_primitive(json.loads(handle.read(int.from_bytes(head[12:16], "little")))) is not None
        except (ValueError, AttributeError, TypeError):
            return False


def _written_axes(document: dict) -> str:
    """The turn a file's writer made into glTF's axes: lift3d records its own ("world"); any other file is read as
    converted from the 3DGS .ply frame ("y"), as splat-transform writes them."""
    extras = document.get("asset", {}).get("extras")
    ours = extras.get("lift3d") if isinstance(extras, dict) else None
    return "world" if isinstance(ours, dict) and ours.get("axes") == "world" else "y"


def load_gltf_splat(path: str | Path, up_axis: str = "y") -> dict[str, Tensor]:
    """Pre-activation parameters of a KHR_gaussian_splatting .glb, in lift3d's world (see the module docstring)."""
    return decode_gltf_splat(read_file(path, "glTF file"), str(path), up_axis)


register_codec(".glb", load_gltf_splat, save_gltf_splat, "glTF with KHR_gaussian_splatting")
