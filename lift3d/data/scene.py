"""A scene folder in any supported layout -> posed, undistorted, normalised images split into train and val.

``detect_format`` names the layout from the folder's contents; ``read_capture`` runs that format's reader;
``load_frames`` reads the pixels (EXIF-upright, undistorted to pinhole once, downscaled) into a
``PosedScene``; ``split_frames`` holds out every n-th frame when the format has no splits of its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.cameras import Cameras, intrinsics_matrix
from lift3d.data.capture import Capture, Lens, SceneFormatError
from lift3d.data.images import load_mask, load_rgba
from lift3d.data.undistort import Undistortion, plan_undistortion

log = logging.getLogger("lift3d.data")
FORMATS = ("auto", "blender", "nerfstudio", "instant-ngp", "colmap")
VIDEO_SUFFIXES = (".mp4", ".mov", ".m4v", ".avi", ".mkv", ".webm")


@dataclass
class PosedScene:
    """One split of a scene: images and the cameras that took them."""

    rgba: Tensor  # [N, H, W, 4] uint8 (alpha 255 for RGB photos)
    cameras: Cameras  # N cameras, OpenGL c2w
    paths: list[str]

    def __len__(self) -> int:
        return self.rgba.shape[0]


def detect_format(root: Path) -> str:
    """``blender``, ``transforms`` (nerfstudio / instant-ngp) or ``colmap`` from what ``root`` holds."""
    from lift3d.data.colmap_model import find_model

    if not root.is_dir():
        what = "a video" if root.suffix.lower() in VIDEO_SUFFIXES else "a folder"
        raise SceneFormatError(f"{root} is not {what} lift3d can read" + ("" if root.exists() else " (it does not exist)"))
    if (root / "transforms_train.json").is_file():
        return "blender"
    if (root / "transforms.json").is_file():
        return "transforms"
    if find_model(root) is not None:
        return "colmap"
    raise SceneFormatError(
        f"{root} holds no poses lift3d can read. A scene folder is one of: Blender / NeRF-synthetic "
        "(transforms_train.json + transforms_val.json), nerfstudio or instant-ngp (transforms.json), or COLMAP "
        "(sparse/0/ or sparse/ beside images/); a folder of photos alone, or a video, gets its poses from "
        "structure from motion (`lift3d poses PATH`)")


def read_capture(root: Path, format: str = "auto", downscale: int = 1) -> tuple[Capture, int]:
    """The capture in ``root`` read by the reader of ``format`` (``auto``: detected), and the downscale
    left to apply to its images when they are read."""
    from lift3d.data.colmap import read_colmap
    from lift3d.data.transforms_json import read_blender, read_transforms_json

    if format not in FORMATS:
        raise SceneFormatError(f"data.format must be one of {', '.join(FORMATS)}, got {format!r}")
    layout = detect_format(root) if format == "auto" else {"nerfstudio": "transforms", "instant-ngp": "transforms"}.get(format, format)
    if layout == "blender":
        capture = read_blender(root)
    elif layout == "transforms":
        if not (root / "transforms.json").is_file():
            raise SceneFormatError(f"data.format={format} needs {root / 'transforms.json'}")
        capture = read_transforms_json(root)
    else:
        return read_colmap(root, downscale)
    return capture, downscale


def check_present(capture: Capture) -> None:
    """Warn once about frames listed without an image; refuse a capture with none at all."""
    if capture.missing:
        shown = ", ".join(capture.missing[:5]) + (" ..." if len(capture.missing) > 5 else "")
        total = len(capture.frames) + len(capture.missing)
        if not capture.frames:
            raise SceneFormatError(f"none of the {total} frames listed in {capture.root} has its image file ({shown})")
        log.warning("%d of %d frames listed in %s have no image and are skipped: %s", len(capture.missing), total, capture.root, shown)


def split_frames(capture: Capture, holdout_every: int) -> dict[str, list[int]]:
    """Train / val frame indices: the format's own splits when it has them, else every ``holdout_every``-th
    frame (in name order, the Mip-NeRF 360 convention) held out for val. A capture of one frame trains and
    validates on it."""
    if capture.splits and capture.splits.get("train"):
        splits = dict(capture.splits)
        splits.setdefault("val", splits.get("test") or splits["train"][:1])
        return splits
    order = sorted(range(len(capture.frames)), key=lambda i: capture.frames[i].name or str(capture.frames[i].image))
    if holdout_every <= 0 or len(order) < 2:
        return {"train": order, "val": order[:1]}
    val = order[::holdout_every]
    return {"train": [i for i in order if i not in set(val)], "val": val}


class FrameLoader:
    """Reads frames into ``PosedScene``s with one undistortion plan per distinct lens (made once)."""

    def __init__(self, capture: Capture, downscale: int = 1, undistort: bool = True) -> None:
        self.capture, self.downscale, self.undistort = capture, downscale, undistort
        self._plans: dict[Lens, Undistortion] = {}
        self.reported: set[str] = set()

    def _plan(self, lens: Lens) -> Undistortion:
        if lens not in self._plans:
            self._plans[lens] = plan_undistortion(lens)
            plan = self._plans[lens]
            self._say(f"undistorted {lens.describe()} to pinhole with OpenCV, cropped to the {plan.lens.width}x"
                      f"{plan.lens.height} valid pixels")
        return self._plans[lens]

    def _say(self, message: str) -> None:
        if message not in self.reported:
            self.reported.add(message)
            log.info(message)

    def load(self, indices: list[int], c2w: np.ndarray) -> PosedScene:
        """Frames ``indices`` with poses ``c2w`` [len(capture), 4, 4] (already normalised)."""
        images, intrinsics, paths = [], [], []
        size: tuple[int, int] | None = None
        for i in indices:
            frame = self.capture.frames[i]
            rgba = load_rgba(frame.image, self.downscale)
            height, width = rgba.shape[:2]
            lens = frame.lens
            if abs(width / height - lens.width / lens.height) > 0.02:
                raise SceneFormatError(f"{frame.image} is {width}x{height} but its camera says {lens.width}x{lens.height}: "
                                       "a rotated or cropped photo? (EXIF orientation is applied)")
            lens = lens.scaled(width, height)
            if frame.mask is not None:
                rgba[..., 3] = load_mask(frame.mask, (width, height))
            if lens.distorted and self.undistort:
                plan = self._plan(lens)
                rgba, lens = plan.apply(rgba), plan.lens
            elif lens.distorted:
                self._say(f"ignoring the lens distortion of {lens.describe()} (data.undistort=false)")
            if size is None:
                size = (lens.width, lens.height)
            elif size != (lens.width, lens.height):
                raise SceneFormatError(f"{frame.image} is {lens.width}x{lens.height} after loading, the frames before it "
                                       f"{size[0]}x{size[1]}: lift3d trains on images of one size (resize them, or use "
                                       "data.downscale)")
            images.append(rgba)
            intrinsics.append(intrinsics_matrix(torch.tensor(lens.fx), torch.tensor(lens.fy), torch.tensor(lens.cx), torch.tensor(lens.cy)))
            paths.append(str(frame.image))
        if not images:
            raise SceneFormatError(f"no frames to load from {self.capture.root}")
        poses = torch.tensor(c2w[indices], dtype=torch.float32)
        cameras = Cameras(poses, torch.stack(intrinsics).float(), size[0], size[1])
        return PosedScene(torch.from_numpy(np.stack(images)), cameras, paths)
