"""Texture images inside or beside a mesh file (glTF, OBJ + MTL) checked against ``TEXTURE_PIXELS`` from their headers,
before a mesh reader decodes any of them: a hostile texture is one line naming it, not a decompression bomb."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _embedded_images(path: Path) -> list[tuple[str, Any]]:
    """(a name, a file or a byte stream) of every image a glTF (.glb, .gltf) or an .obj's material library names."""
    import base64
    import io
    import json
    import re
    import struct

    found: list[tuple[str, Any]] = []
    suffix = path.suffix.lower()
    if suffix in (".glb", ".gltf"):
        data = path.read_bytes()
        blob = b""
        try:
            if data[:4] == b"glTF":
                length = struct.unpack_from("<I", data, 12)[0]
                document = json.loads(data[20:20 + length])
                blob = data[20 + length + 8:]
            else:
                document = json.loads(data)
        except (ValueError, struct.error):
            return []  # not a glTF lift3d can parse: trimesh says what is wrong with it
        views = document.get("bufferViews", []) if isinstance(document, dict) else []
        for index, image in enumerate(document.get("images", []) if isinstance(document, dict) else []):
            name = f"{path.name}'s image {index}"
            uri, view = image.get("uri", ""), image.get("bufferView")
            if isinstance(view, int) and 0 <= view < len(views) and isinstance(views[view], dict):
                start = int(views[view].get("byteOffset", 0))
                found.append((name, io.BytesIO(blob[start:start + int(views[view].get("byteLength", 0))])))
            elif isinstance(uri, str) and uri.startswith("data:") and "," in uri:
                found.append((name, io.BytesIO(base64.b64decode(uri.split(",", 1)[1], validate=False))))
            elif isinstance(uri, str) and uri and (path.parent / uri).is_file():
                found.append((str(path.parent / uri), path.parent / uri))
    elif suffix == ".obj":
        with open(path, "rb") as handle:
            libraries = re.findall(rb"^mtllib\s+(.+?)\s*$", handle.read(1 << 20), re.MULTILINE)
        for library in libraries:
            mtl = path.parent / library.decode("utf-8", "replace")
            if mtl.is_file() and mtl.stat().st_size < 1 << 24:
                for texture in re.findall(rb"^\s*map_\w+\s+(?:-\S+\s+\S+\s+)*(.+?)\s*$", mtl.read_bytes(), re.MULTILINE):
                    image = path.parent / texture.decode("utf-8", "replace")
                    if image.is_file():
                        found.append((str(image), image))
    return found


def check_textures(path: Path) -> None:
    """Refuse (ValueError, naming the image, its size and the limit) a mesh file whose embedded or linked texture
    holds more pixels than ``TEXTURE_PIXELS``, from the images' headers, before trimesh decodes any of them."""
    from lift3d.imaging import open_image
    from lift3d.limits import TEXTURE_PIXELS

    for name, source in _embedded_images(path):
        try:
            open_image(source, name, ValueError, TEXTURE_PIXELS, fix="save the mesh again with a smaller texture").close()
        except (OSError, SyntaxError):
            continue  # an image Pillow cannot read: trimesh loads the mesh without it
