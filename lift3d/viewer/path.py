"""Camera paths recorded in the viewer (``path.json``) and their frames for ``lift3d render``.

``path.json``::

    {"version": 1, "fps": 30, "seconds": 4.0, "frames": null, "width": 640, "height": 480,
     "interpolation": "spline", "keyframes": [{"c2w": [[...4 rows of 4...]], "fovy_deg": 50.0}, ...]}

``c2w`` is lift3d's camera-to-world (OpenGL axes, +z up world); ``frames`` (when set) wins over ``fps * seconds``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy
from lift3d.config import ConfigError
from lift3d.viewer.camera_math import interpolate_path

PATH_VERSION = 1


@dataclass
class Keyframe:
    """One recorded camera: where it is and how wide it sees."""

    c2w: list  # 4x4 camera-to-world, OpenGL axes, as nested lists
    fovy_deg: float  # vertical field of view in degrees


@dataclass
class CameraPath:
    """Keyframes and timing of a camera path."""

    keyframes: list[Keyframe] = field(default_factory=list)  # in playback order
    fps: float = 30.0  # frames per second of the video
    seconds: float = 4.0  # length of the video (used when frames is None)
    frames: int | None = None  # exact frame count (wins over fps * seconds)
    width: int = 640  # video width in pixels
    height: int = 480  # video height in pixels
    interpolation: str = "spline"  # positions: spline (Catmull-Rom) or linear; rotations always slerp

    def frame_count(self) -> int:
        """Frames in the video: ``frames`` when given, else ``round(fps * seconds)`` (at least 1)."""
        return self.frames if self.frames is not None else max(1, round(self.fps * self.seconds))

    def to_json(self) -> dict[str, Any]:
        return {"version": PATH_VERSION, "fps": self.fps, "seconds": self.seconds, "frames": self.frames,
                "width": self.width, "height": self.height, "interpolation": self.interpolation,
                "keyframes": [{"c2w": k.c2w, "fovy_deg": k.fovy_deg} for k in self.keyframes]}


def _number(record: dict, key: str, default: Any, kind: type, where: str) -> Any:
    value = record.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}: '{key}' must be a positive number, got {value!r}")
    if kind is int and value != int(value):
        raise ConfigError(f"{where}: '{key}' must be a whole number, got {value!r}")
    return kind(value)


def parse_camera_path(record: Any, where: str = "the camera path") -> CameraPath:
    """A ``CameraPath`` from the JSON object of a path.json; every malformed part is a ConfigError naming it."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where} must be a JSON object with keyframes, fps and seconds or frames")
    keyframes = record.get("keyframes")
    if not isinstance(keyframes, list) or not keyframes:
        raise ConfigError(f"{where} has no keyframes: record some in the viewer (lift3d view RUN, Camera path > Add keyframe)")
    parsed: list[Keyframe] = []
    for n, item in enumerate(keyframes):
        c2w = item.get("c2w") if isinstance(item, dict) else None
        try:
            matrix = torch.tensor(c2w, dtype=torch.float64)
        except (TypeError, ValueError):
            matrix = None
        if matrix is None or matrix.shape != (4, 4) or not torch.isfinite(matrix).all():
            raise ConfigError(f"{where}: keyframe {n} needs 'c2w', a 4x4 matrix of numbers")
        fovy = _number(item, "fovy_deg", 50.0, float, f"{where}: keyframe {n}")
        if fovy >= 180:
            raise ConfigError(f"{where}: keyframe {n} has fovy_deg {fovy}; it must be below 180")
        parsed.append(Keyframe(matrix.tolist(), fovy))
    interpolation = record.get("interpolation", "spline")
    if interpolation not in ("spline", "linear"):
        raise ConfigError(f"{where}: interpolation must be spline or linear, got {interpolation!r}")
    return CameraPath(parsed, fps=_number(record, "fps", 30.0, float, where),
                      seconds=_number(record, "seconds", 4.0, float, where), frames=_number(record, "frames", None, int, where),
                      width=_number(record, "width", 640, int, where),
                      height=_number(record, "height", 480, int, where), interpolation=interpolation)


def load_camera_path(path: str | Path) -> CameraPath:
    """Read a path.json written by the viewer (or by hand)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"camera path not found: {path} (record one in lift3d view: Camera path > Save)")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None
    return parse_camera_path(record, str(path))


def save_camera_path(path: str | Path, camera_path: CameraPath) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(camera_path.to_json(), indent=1) + "\n")
    return path


def path_cameras(camera_path: CameraPath, width: int | None = None, height: int | None = None) -> Cameras:
    """One lift3d camera per video frame along the path (``width``/``height`` override the path's size)."""
    c2w = torch.tensor([k.c2w for k in camera_path.keyframes], dtype=torch.float64)
    fovy = torch.tensor([math.radians(k.fovy_deg) for k in camera_path.keyframes], dtype=torch.float64)
    frames_c2w, frames_fovy = interpolate_path(c2w, fovy, camera_path.frame_count(), camera_path.interpolation)
    w, h = width or camera_path.width, height or camera_path.height
    return Cameras(frames_c2w.float(), intrinsics_from_fovy(frames_fovy.float(), w, h), w, h)


# ----------------------------------------------------------------------------------- paths made without the viewer
MAX_THROUGH_KEYFRAMES = 24  # cameras a path through the training cameras passes (more would zigzag between neighbors)
DEFAULT_HOME = ((3.4, 0.0, 1.6), (0.0, 0.0, 0.0))  # (position, look-at) where no model says where to look from


def orbit_path(home: tuple[tuple[float, ...], tuple[float, ...]] | None, frames: int, width: int, height: int,
               fovy_deg: float = 40.0, elevation_deg: float | None = None) -> Cameras:
    """A full turn of ``frames`` cameras around the look-at point of ``home`` (position, look-at), at its distance,
    starting where it stands, at its elevation unless ``elevation_deg`` is given (+z up)."""
    from lift3d.export.video import orbit_cameras

    position, target = (torch.tensor(p, dtype=torch.float64) for p in (home or DEFAULT_HOME))
    offset = position - target
    distance = float(offset.norm())
    if not math.isfinite(distance) or distance < 1e-6:
        raise ConfigError("the model gives no camera distance to orbit at (its home camera sits on its center)")
    elevation = math.degrees(math.asin(float(offset[2]) / distance)) if elevation_deg is None else elevation_deg
    azimuth = math.degrees(math.atan2(float(offset[1]), float(offset[0])))
    return orbit_cameras(frames, elevation, distance, fovy_deg, width, height, start_azimuth_deg=azimuth,
                         target=tuple(target.tolist()))


def walk_order(positions: torch.Tensor) -> list[int]:
    """An order of the points [N, 3] as a walk: from the first, always to the nearest one not yet visited."""
    left = list(range(1, len(positions)))
    order = [0] if len(positions) else []
    while left:
        distances = (positions[left] - positions[order[-1]]).norm(dim=-1)
        order.append(left.pop(int(distances.argmin())))
    return order


def camera_path_through(cameras: Cameras, frames: int) -> Cameras:
    """``frames`` cameras on a smooth path through ``cameras`` (the training cameras): visited as a walk from the first
    to its nearest unvisited neighbor, at most MAX_THROUGH_KEYFRAMES of them evenly picked along the walk as keyframes
    (a spline through every photo of a dense capture would jitter), positions on a Catmull-Rom spline, rotations by
    slerp, fields of view between the keyframes'; the cameras' own size. A stand-in for ``lift3d.camera_paths``'
    function of the same name (the test video's path), which ``lift3d render`` takes where it exists."""
    if len(cameras) < 1 or frames < 1:
        raise ConfigError(f"a path through the training cameras needs cameras and frames, got {len(cameras)} and {frames}")
    c2w = cameras.c2w.detach().cpu().double()
    order = walk_order(c2w[:, :3, 3])
    picks = torch.linspace(0, len(order) - 1, min(MAX_THROUGH_KEYFRAMES, len(order))).round().long().unique()
    keys = [order[int(i)] for i in picks]
    fovy = 2 * torch.atan(0.5 * cameras.height / cameras.intrinsics[:, 1, 1].detach().cpu().double())
    frames_c2w, frames_fovy = interpolate_path(c2w[keys], fovy[keys], frames, "spline")
    return Cameras(frames_c2w.float(), intrinsics_from_fovy(frames_fovy.float(), cameras.width, cameras.height),
                   cameras.width, cameras.height)
