"""COLMAP sparse models (``cameras``, ``images``, ``points3D``), binary and text: read and write, no pycolmap.

The layouts are COLMAP's own (``src/colmap/scene/reconstruction_io.cc``): little-endian binary with
64-bit counts, or the documented text files. Poses are world-to-camera, OpenCV axes, quaternion
``qw qx qy qz`` + translation. ``lift3d.data.colmap`` turns a model into a ``Capture``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from lift3d.data.capture import SceneFormatError

# model id -> (name, number of parameters), as COLMAP numbers them
CAMERA_MODELS: dict[int, tuple[str, int]] = {
    0: ("SIMPLE_PINHOLE", 3), 1: ("PINHOLE", 4), 2: ("SIMPLE_RADIAL", 4), 3: ("RADIAL", 5), 4: ("OPENCV", 8),
    5: ("OPENCV_FISHEYE", 8), 6: ("FULL_OPENCV", 12), 7: ("FOV", 5), 8: ("SIMPLE_RADIAL_FISHEYE", 4),
    9: ("RADIAL_FISHEYE", 5), 10: ("THIN_PRISM_FISHEYE", 12), 11: ("RAD_TAN_THIN_PRISM_FISHEYE", 16),
}
MODEL_IDS = {name: (model_id, n) for model_id, (name, n) in CAMERA_MODELS.items()}


@dataclass
class ColmapCamera:
    id: int
    model: str
    width: int
    height: int
    params: np.ndarray  # float64, COLMAP's order for the model


@dataclass
class ColmapImage:
    id: int
    qvec: np.ndarray  # [4] w x y z, world-to-camera rotation
    tvec: np.ndarray  # [3] world-to-camera translation
    camera_id: int
    name: str
    xys: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # [K, 2] keypoints
    point3d_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [K], -1 where none


@dataclass
class ColmapPoint:
    id: int
    xyz: np.ndarray  # [3]
    rgb: np.ndarray  # [3] uint8
    error: float
    track: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))  # [L, 2] image id, point2D index


@dataclass
class ColmapModel:
    cameras: dict[int, ColmapCamera]
    images: dict[int, ColmapImage]
    points: dict[int, ColmapPoint]


# ----------------------------------------------------------------------------------------------- binary
def _read(f: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise SceneFormatError(f"{getattr(f, 'name', 'COLMAP file')} ends early: truncated or not a COLMAP binary model")
    return struct.unpack("<" + fmt, data)


def _read_name(f: BinaryIO) -> str:
    chars = bytearray()
    while (c := f.read(1)) not in (b"\x00", b""):
        chars += c
    return chars.decode("utf-8")


def read_cameras_binary(path: Path) -> dict[int, ColmapCamera]:
    cameras = {}
    with open(path, "rb") as f:
        for _ in range(_read(f, "Q")[0]):
            camera_id, model_id, width, height = _read(f, "iiQQ")
            if model_id not in CAMERA_MODELS:
                raise SceneFormatError(f"{path}: camera {camera_id} has unknown model id {model_id}")
            name, n = CAMERA_MODELS[model_id]
            cameras[camera_id] = ColmapCamera(camera_id, name, width, height, np.array(_read(f, "d" * n)))
    return cameras


def read_images_binary(path: Path) -> dict[int, ColmapImage]:
    images = {}
    with open(path, "rb") as f:
        for _ in range(_read(f, "Q")[0]):
            image_id, *pose, camera_id = _read(f, "idddddddi")
            name = _read_name(f)
            n = _read(f, "Q")[0]
            data = np.frombuffer(f.read(24 * n), dtype=[("xy", "<f8", 2), ("id", "<i8")]) if n else None
            if n and len(data) != n:
                raise SceneFormatError(f"{path} ends early: truncated or not a COLMAP binary model")
            xys = data["xy"].copy() if n else np.zeros((0, 2))
            ids = data["id"].copy() if n else np.zeros(0, np.int64)
            images[image_id] = ColmapImage(image_id, np.array(pose[:4]), np.array(pose[4:]), camera_id, name, xys, ids)
    return images


def read_points3d_binary(path: Path) -> dict[int, ColmapPoint]:
    points = {}
    with open(path, "rb") as f:
        for _ in range(_read(f, "Q")[0]):
            point_id, x, y, z, r, g, b, error, length = _read(f, "QdddBBBdQ")
            raw = f.read(8 * length)
            if len(raw) != 8 * length:
                raise SceneFormatError(f"{path} ends early: truncated or not a COLMAP binary model")
            track = np.frombuffer(raw, dtype="<i4").reshape(-1, 2).astype(np.int64)
            points[point_id] = ColmapPoint(point_id, np.array([x, y, z]), np.array([r, g, b], np.uint8), error, track)
    return points


def write_model_binary(model: ColmapModel, folder: Path) -> None:
    """``cameras.bin``, ``images.bin``, ``points3D.bin`` into ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "cameras.bin", "wb") as f:
        f.write(struct.pack("<Q", len(model.cameras)))
        for cam in model.cameras.values():
            f.write(struct.pack("<iiQQ", cam.id, MODEL_IDS[cam.model][0], cam.width, cam.height))
            f.write(struct.pack("<" + "d" * len(cam.params), *cam.params))
    with open(folder / "images.bin", "wb") as f:
        f.write(struct.pack("<Q", len(model.images)))
        for im in model.images.values():
            f.write(struct.pack("<idddddddi", im.id, *im.qvec, *im.tvec, im.camera_id))
            f.write(im.name.encode("utf-8") + b"\x00")
            f.write(struct.pack("<Q", len(im.xys)))
            for (x, y), pid in zip(im.xys, im.point3d_ids):
                f.write(struct.pack("<ddq", x, y, pid))
    with open(folder / "points3D.bin", "wb") as f:
        f.write(struct.pack("<Q", len(model.points)))
        for p in model.points.values():
            f.write(struct.pack("<QdddBBBdQ", p.id, *p.xyz, *(int(c) for c in p.rgb), p.error, len(p.track)))
            f.write(np.asarray(p.track, dtype="<i4").tobytes())


# ----------------------------------------------------------------------------------------------- text
def _data_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]


def read_cameras_text(path: Path) -> dict[int, ColmapCamera]:
    cameras = {}
    for line in _data_lines(path):
        parts = line.split()
        try:
            camera_id, model, width, height = int(parts[0]), parts[1], int(parts[2]), int(parts[3])
            params = np.array([float(v) for v in parts[4:]])
        except (IndexError, ValueError):
            raise SceneFormatError(f"{path}: bad camera line {line!r} "
                                   "(expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS...)") from None
        if model not in MODEL_IDS or len(params) != MODEL_IDS[model][1]:
            raise SceneFormatError(f"{path}: camera {camera_id}: unknown model {model!r} or wrong parameter count")
        cameras[camera_id] = ColmapCamera(camera_id, model, width, height, params)
    return cameras


def read_images_text(path: Path) -> dict[int, ColmapImage]:
    """Two lines an image; the keypoint line may be empty (COLMAP writes an empty line then)."""
    lines = [line.rstrip("\n") for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    images = {}
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        parts = lines[i].split()
        try:
            image_id, pose, camera_id, name = int(parts[0]), [float(v) for v in parts[1:8]], int(parts[8]), " ".join(parts[9:])
        except (IndexError, ValueError):
            raise SceneFormatError(f"{path}: bad image line {lines[i]!r} "
                                   "(expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME)") from None
        keypoints = lines[i + 1].split() if i + 1 < len(lines) else []
        values = np.array([float(v) for v in keypoints]).reshape(-1, 3) if keypoints else np.zeros((0, 3))
        images[image_id] = ColmapImage(image_id, np.array(pose[:4]), np.array(pose[4:]), camera_id, name,
                                       values[:, :2].copy(), values[:, 2].astype(np.int64))
        i += 2
    return images


def read_points3d_text(path: Path) -> dict[int, ColmapPoint]:
    points = {}
    for line in _data_lines(path):
        parts = line.split()
        try:
            point_id, error = int(parts[0]), float(parts[7])
            xyz, rgb = [float(v) for v in parts[1:4]], [int(v) for v in parts[4:7]]
            track = np.array([int(v) for v in parts[8:]], np.int64).reshape(-1, 2)
        except (IndexError, ValueError):
            raise SceneFormatError(f"{path}: bad point line {line[:80]!r} "
                                   "(expected POINT3D_ID X Y Z R G B ERROR TRACK...)") from None
        points[point_id] = ColmapPoint(point_id, np.array(xyz), np.array(rgb, np.uint8), error, track)
    return points


def _format(values: np.ndarray | list) -> str:
    return " ".join(repr(float(v)) for v in values)


def write_model_text(model: ColmapModel, folder: Path) -> None:
    """``cameras.txt``, ``images.txt``, ``points3D.txt`` into ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["# Camera list with one line of data per camera:", "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]"]
    lines += [f"{c.id} {c.model} {c.width} {c.height} {_format(c.params)}" for c in model.cameras.values()]
    (folder / "cameras.txt").write_text("\n".join(lines) + "\n")
    lines = ["# Image list with two lines of data per image:", "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME",
             "#   POINTS2D[] as (X, Y, POINT3D_ID)"]
    for im in model.images.values():
        lines.append(f"{im.id} {_format(im.qvec)} {_format(im.tvec)} {im.camera_id} {im.name}")
        lines.append(" ".join(f"{x!r} {y!r} {int(pid)}" for (x, y), pid in zip(im.xys.tolist(), im.point3d_ids)))
    (folder / "images.txt").write_text("\n".join(lines) + "\n")
    lines = ["# 3D point list with one line of data per point:",
             "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)"]
    for p in model.points.values():
        track = " ".join(str(int(v)) for v in np.asarray(p.track).reshape(-1))
        lines.append(f"{p.id} {_format(p.xyz)} {' '.join(str(int(c)) for c in p.rgb)} {p.error!r} {track}".rstrip())
    (folder / "points3D.txt").write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------------------- folders
def find_model(root: Path) -> Path | None:
    """The folder of the COLMAP model under a scene folder: ``sparse/0``, ``sparse``, ``colmap/sparse/0`` or
    the folder itself (the one holding ``cameras.bin`` or ``cameras.txt``); None if there is none."""
    for candidate in (root / "sparse" / "0", root / "sparse", root / "colmap" / "sparse" / "0", root):
        if (candidate / "cameras.bin").is_file() or (candidate / "cameras.txt").is_file():
            return candidate
    return None


def read_model(folder: Path) -> ColmapModel:
    """A model from ``folder``: binary when ``cameras.bin`` is there, else text; every file must be present."""
    binary = (folder / "cameras.bin").is_file()
    ext = "bin" if binary else "txt"
    needed = [folder / f"{name}.{ext}" for name in ("cameras", "images", "points3D")]
    absent = [p.name for p in needed if not p.is_file()]
    if absent:
        raise SceneFormatError(f"the COLMAP model in {folder} lacks {', '.join(absent)} (a model holds cameras, images "
                               f"and points3D, all .bin or all .txt)")
    if binary:
        return ColmapModel(read_cameras_binary(needed[0]), read_images_binary(needed[1]), read_points3d_binary(needed[2]))
    return ColmapModel(read_cameras_text(needed[0]), read_images_text(needed[1]), read_points3d_text(needed[2]))
