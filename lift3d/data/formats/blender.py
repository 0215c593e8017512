"""Blender / NeRF-synthetic: one ``transforms_<split>.json`` per split (train required) beside its images.

Renders of one object on a transparent background, already in an object frame (+z up, centered): such scenes
are not normalized, trained bounded and never given per-photo appearance. ``read_transforms`` and
``read_cameras`` read one split on its own (the sample scene, reference views, tests).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lift3d.cameras import Cameras
from lift3d.data.capture import Capture, Frame, SceneFormatError
from lift3d.data.formats import CaptureFormat, register_format
from lift3d.data.sample_scene import resolve_asset
from lift3d.data.scene import FrameLoader, PosedScene
from lift3d.data.transforms_json import IMAGE_SUFFIXES, frames_from_meta, load_json, named_files


def read_blender(root: Path, splits: tuple[str, ...] = ("train", "val", "test"),
                 max_frames: dict[str, int] | None = None) -> Capture:
    """The Blender layout: one ``transforms_<split>.json`` per split (train required)."""
    frames: list[Frame] = []
    split_indices: dict[str, list[int]] = {}
    missing: list[str] = []
    for split in splits:
        path = root / f"transforms_{split}.json"
        if not path.is_file():
            if split == "train":
                raise SceneFormatError(f"no transforms_train.json in {root}")
            continue
        split_frames, split_missing = frames_from_meta(load_json(path), root, path, (max_frames or {}).get(split, -1))
        split_indices[split] = list(range(len(frames), len(frames) + len(split_frames)))
        frames += split_frames
        missing += split_missing
    return Capture(root, "blender", frames, split_indices, missing=missing, unbounded=False,
                   notes=[f"Blender layout: {', '.join(f'{k} {len(v)}' for k, v in split_indices.items())} frames"])


def read_transforms(root: str | Path, split: str, downscale: int = 1, max_frames: int = -1) -> PosedScene:
    """One split of a Blender-layout scene (``root/transforms_<split>.json`` and its images), poses as stored."""
    root = resolve_asset(root)  # a path, or lift3d:NAME for a package asset
    path = root / f"transforms_{split}.json"
    if not path.is_file():
        available = sorted(p.name for p in root.glob("transforms_*.json")) if root.is_dir() else []
        raise SceneFormatError(
            f"no {path.name} in {root}"
            + (f" (found: {', '.join(available)})" if available else " (the folder has no transforms_*.json)")
            + ". A scene folder holds transforms_train.json, transforms_val.json, ... as in NeRF-synthetic."
        )
    capture = read_blender(root, (split,), {split: max_frames})
    if capture.missing:
        shown = ", ".join(capture.missing[:5]) + (" ..." if len(capture.missing) > 5 else "")
        raise SceneFormatError(f"{len(capture.missing)} of {len(capture.frames) + len(capture.missing)} frames listed in "
                               f"{path} have no image file: {shown} (looked for {'/'.join(IMAGE_SUFFIXES[:3])} next to "
                               f"the paths, relative to {root})")
    c2w = np.stack([f.c2w for f in capture.frames])
    return FrameLoader(capture, downscale).load(list(range(len(capture))), c2w)


def read_cameras(root: str | Path, split: str) -> Cameras:
    """The cameras of ``root/transforms_<split>.json`` without decoding the images (their size comes from
    the first image's header)."""
    root = resolve_asset(root)  # a path, or lift3d:NAME for a package asset
    if not (root / f"transforms_{split}.json").is_file():
        raise SceneFormatError(f"no transforms_{split}.json in {root}: a scene folder holds transforms_<split>.json "
                               "as in NeRF-synthetic")
    capture = read_blender(root, (split,))
    if not capture.frames:
        raise SceneFormatError(f"{root / f'transforms_{split}.json'}: the image of the first frame is missing")
    lenses = [f.lens for f in capture.frames]
    intrinsics = torch.tensor(np.stack([lens.matrix() for lens in lenses]), dtype=torch.float32)
    c2w = torch.tensor(np.stack([f.c2w for f in capture.frames]), dtype=torch.float32)
    return Cameras(c2w, intrinsics, lenses[0].width, lenses[0].height)


FORMAT = register_format(CaptureFormat(
    name="blender",
    description="Blender / NeRF-synthetic (transforms_train.json + transforms_val.json)",
    detect=lambda path: (path / "transforms_train.json").is_file(),
    read=lambda root, downscale: (read_blender(root), downscale),
    object_centric=True,
    priority=10,
    named_files=lambda root: named_files(root, sorted(p.name for p in root.glob("transforms_*.json"))),
))
