"""nerfstudio and instant-ngp: one ``transforms.json`` beside the images (one reader: the dialects share the layout).

nerfstudio adds ``camera_model``, ``mask_path`` (pixels to ignore), ``ply_file_path`` (sparse points),
``applied_transform`` and ``*_filenames`` splits; instant-ngp adds ``aabb_scale`` (> 1: an unbounded scene).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lift3d.data.capture import Capture, SceneFormatError
from lift3d.data.formats import CaptureFormat, register_format
from lift3d.data.point_cloud import read_point_cloud
from lift3d.data.transforms_json import frames_from_meta, load_json, named_files

_SPLIT_KEYS = {"train": "train_filenames", "val": "val_filenames", "test": "test_filenames"}


def _read_points(root: Path, meta: dict) -> tuple[np.ndarray | None, np.ndarray | None]:
    if not meta.get("ply_file_path"):
        return None, None
    points, colors = read_point_cloud(root / meta["ply_file_path"])
    return points, (colors * 255).round().astype(np.uint8)


def read_transforms_json(root: Path, max_frames: int = -1) -> Capture:
    """One ``transforms.json`` (nerfstudio or instant-ngp): frames, named splits if the file has them."""
    path = root / "transforms.json"
    meta = load_json(path)
    nerfstudio = "camera_model" in meta or "applied_transform" in meta or "ply_file_path" in meta
    dialect = "nerfstudio" if nerfstudio else "instant-ngp"
    frames, missing = frames_from_meta(meta, root, path, max_frames)
    splits = None
    if any(key in meta for key in _SPLIT_KEYS.values()):
        by_name = {Path(f.name).as_posix().removeprefix("./"): i for i, f in enumerate(frames)}
        splits = {split: [by_name[n] for n in (Path(x).as_posix().removeprefix("./") for x in meta.get(key, []))
                          if n in by_name]
                  for split, key in _SPLIT_KEYS.items() if key in meta}
    points, colors = _read_points(root, meta)
    aabb_scale = float(meta.get("aabb_scale", 1))
    notes = [f"{dialect} transforms.json: {len(frames)} frames"
             + (f", aabb_scale {aabb_scale:g}" if "aabb_scale" in meta else "")]
    if "applied_transform" in meta:
        notes.append("applied_transform recorded (poses are already in that frame)")
    unbounded = aabb_scale > 1 if "aabb_scale" in meta else None
    # mask_path is nerfstudio's: its masks mark pixels to leave out of the loss (0 = ignore), not an object's cut-out
    mask_mode = "ignore" if any(f.mask is not None for f in frames) else "alpha"
    if mask_mode == "ignore":
        notes.append("mask_path: black mask pixels are ignored, as nerfstudio reads them (data.mask_mode=alpha: cut-outs)")
    return Capture(root, dialect, frames, splits, points, colors, missing, unbounded, notes, mask_mode)


def _read(root: Path, downscale: int) -> tuple[Capture, int]:
    if not (root / "transforms.json").is_file():  # data.format named it for a folder without one
        raise SceneFormatError(f"data.format=nerfstudio or instant-ngp needs {root / 'transforms.json'}")
    return read_transforms_json(root), downscale


FORMAT = register_format(CaptureFormat(
    name="transforms",
    description="nerfstudio or instant-ngp (transforms.json)",
    detect=lambda path: (path / "transforms.json").is_file(),
    read=_read,
    priority=20,
    config_names=("nerfstudio", "instant-ngp"),
    named_files=lambda root: named_files(root, ["transforms.json"]),
))
