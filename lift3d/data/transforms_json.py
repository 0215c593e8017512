"""Parsing shared by the transforms-file formats: Blender / NeRF-synthetic ``transforms_<split>.json``
(``formats/blender.py``) and the single ``transforms.json`` of nerfstudio and instant-ngp (``formats/transforms.py``).

All of them store camera-to-world matrices with OpenGL camera axes and intrinsics either as a field of
view (``camera_angle_x/y``) or in pixels (``fl_x fl_y cx cy``, globally or per frame), with optional
distortion ``k1..k4 p1 p2``. nerfstudio adds ``camera_model`` (PINHOLE, OPENCV, OPENCV_FISHEYE),
``mask_path``, ``ply_file_path`` (sparse points), ``applied_transform`` and ``*_filenames`` splits;
instant-ngp adds ``aabb_scale``, ``scale``/``offset`` (its own unit-cube mapping, not needed here:
lift3d normalizes the scene itself) and ``is_fisheye``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lift3d.data.capture import Frame, Lens, SceneFormatError, check_camera
from lift3d.imaging import open_image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG")


def find_image(root: Path, file_path: str) -> Path | None:
    """The image a frame names (relative to ``root``; Blender omits the extension), or None."""
    candidate = (root / file_path).resolve()
    if candidate.suffix in IMAGE_SUFFIXES and candidate.is_file():
        return candidate
    for suffix in IMAGE_SUFFIXES:
        with_suffix = candidate.with_name(candidate.name + suffix)
        if with_suffix.is_file():
            return with_suffix
    return None


def load_json(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SceneFormatError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(meta, dict):
        raise SceneFormatError(f"{path} must hold a JSON object with a 'frames' list")
    return meta


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) as stored, after EXIF orientation (the header only: no decoding; over the pixel limit or
    unreadable: SceneFormatError)."""
    try:
        with open_image(path, str(path), SceneFormatError) as image:
            width, height = image.size
            orientation = image.getexif().get(0x0112, 1)
    except (OSError, SyntaxError) as error:
        raise SceneFormatError(f"cannot read the image {path}: {error} (save it again as .jpg or .png)") from None
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def lens_from_meta(meta: dict[str, Any], frame: dict[str, Any], size: tuple[int, int], source: Path) -> Lens:
    """The lens of one frame: frame keys override the file's global ones."""
    merged = {**meta, **frame}
    width = int(merged.get("w", size[0]))
    height = int(merged.get("h", size[1]))
    if "fl_x" in merged:
        fx = float(merged["fl_x"])
        fy = float(merged.get("fl_y", fx))
    elif "camera_angle_x" in merged:
        angles = [float(merged[key]) for key in ("camera_angle_x", "camera_angle_y") if key in merged]
        if not all(0.0 < angle < math.pi for angle in angles if math.isfinite(angle)):
            raise SceneFormatError(f"{source}: camera_angle_x/y must be a field of view in radians between 0 and pi, got "
                                   f"{', '.join(f'{a:g}' for a in angles)}")
        fx = 0.5 * width / math.tan(0.5 * angles[0])
        fy = 0.5 * height / math.tan(0.5 * angles[1]) if len(angles) > 1 else fx
    else:
        raise SceneFormatError(f"{source} gives no intrinsics: add 'camera_angle_x' or 'fl_x' (+ 'fl_y', 'cx', 'cy')")
    cx, cy = float(merged.get("cx", width / 2)), float(merged.get("cy", height / 2))
    k = [float(merged.get(name, 0.0)) for name in ("k1", "k2", "k3", "k4")]
    p = [float(merged.get(name, 0.0)) for name in ("p1", "p2")]
    model = str(merged.get("camera_model", "OPENCV_FISHEYE" if merged.get("is_fisheye") else "OPENCV")).upper()
    if model == "OPENCV_FISHEYE":
        return Lens(width, height, fx, fy, cx, cy, "fisheye", tuple(k))
    if model in ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE"):
        if model != "OPENCV" or not any(k + p):
            return Lens(width, height, fx, fy, cx, cy)
        if k[3]:
            raise SceneFormatError(f"{source}: k4 with the OPENCV camera model is not supported (use OPENCV_FISHEYE for k1..k4)")
        return Lens(width, height, fx, fy, cx, cy, "opencv", (k[0], k[1], p[0], p[1], k[2]) if k[2] else (k[0], k[1], p[0], p[1]))
    raise SceneFormatError(f"{source}: camera_model {model} is not supported (PINHOLE, OPENCV or OPENCV_FISHEYE)")


def pose_matrix(frame: dict[str, Any], source: Path, index: int) -> np.ndarray:
    """The frame's 4x4 camera-to-world (3x4 is completed)."""
    if "transform_matrix" not in frame:
        raise SceneFormatError(f"{source}: frame {index} needs 'transform_matrix'")
    c2w = np.asarray(frame["transform_matrix"], dtype=np.float64)
    if c2w.shape == (3, 4):
        c2w = np.concatenate([c2w, [[0.0, 0.0, 0.0, 1.0]]])
    if c2w.shape != (4, 4):
        raise SceneFormatError(f"{source}: transform_matrix must be 4x4 (or 3x4), got {c2w.shape} in frame {index}")
    return c2w


def frames_from_meta(meta: dict[str, Any], root: Path, source: Path, max_frames: int = -1) -> tuple[list[Frame], list[str]]:
    """Every frame whose image exists (in file order), and the ``file_path`` of those that do not."""
    entries = meta.get("frames")
    if not isinstance(entries, list) or not entries:
        raise SceneFormatError(f"{source} has no 'frames' list")
    if max_frames > 0 and len(entries) > max_frames:
        entries = [entries[i] for i in np.linspace(0, len(entries) - 1, max_frames).round().astype(int)]
    frames, missing = [], []
    size: tuple[int, int] | None = None
    for i, entry in enumerate(entries):
        if "file_path" not in entry:
            raise SceneFormatError(f"{source}: frame {i} needs 'file_path' and 'transform_matrix'")
        c2w = pose_matrix(entry, source, i)
        path = find_image(root, entry["file_path"])
        if path is None:
            missing.append(str(entry["file_path"]))
            continue
        # every photo its own size: read from its header unless the file gives one size for all
        own_size = any(key in entry for key in ("w", "h", "fl_x", "camera_angle_x"))
        if size is None or "w" not in meta or "h" not in meta or own_size:
            size = image_size(path)
        mask = find_image(root, entry["mask_path"]) if entry.get("mask_path") else None
        if entry.get("mask_path") and mask is None:
            raise SceneFormatError(f"{source}: frame {i}'s mask {entry['mask_path']} is missing")
        lens = lens_from_meta(meta, entry, size, source)
        check_camera(c2w, lens, source, str(entry["file_path"]))
        frames.append(Frame(path, c2w, lens, mask, name=str(entry["file_path"])))
    return frames, missing


_FRAME_KEYS = ("file_path", "mask_path", "depth_file_path")  # per-frame paths of transforms files
_SCENE_KEYS = ("ply_file_path",)  # scene-wide paths of transforms files


def named_files(root: Path, files: list[str]) -> list[tuple[str, Path]]:
    """Every file that the transforms files ``files`` in ``root`` name, as (written, path), from the JSON alone."""
    found: list[tuple[str, Path]] = []
    for name in files:
        meta = load_json(root / name)
        entries = [meta] + [f for f in meta.get("frames") or [] if isinstance(f, dict)]
        for entry in entries:
            for key in _SCENE_KEYS if entry is meta else _FRAME_KEYS:
                if entry.get(key) not in (None, ""):
                    found.append((str(entry[key]), root / str(entry[key])))
    return found
