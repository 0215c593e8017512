"""Posed photos in the Blender / NeRF-synthetic layout (``transforms_<split>.json`` + RGBA images)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader

from lift3d.cameras import Cameras, c2w_to_spherical, intrinsics_matrix, look_at, spherical_to_position
from lift3d.data.base import BaseDataModule, step_loader, view_loader
from lift3d.registry import register

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG")


class SceneFormatError(ValueError):
    """A transforms file or image set that lift3d cannot read; the message says what to fix."""


@dataclass
class PosedScene:
    """One split of a scene: images and the cameras that took them."""

    rgba: Tensor  # [N, H, W, 4] uint8 (alpha 255 for RGB photos)
    cameras: Cameras  # N cameras, OpenGL c2w
    paths: list[str]

    def __len__(self) -> int:
        return self.rgba.shape[0]


def _find_image(root: Path, file_path: str) -> Path | None:
    candidate = (root / file_path).resolve()
    if candidate.suffix in IMAGE_SUFFIXES and candidate.is_file():
        return candidate
    for suffix in IMAGE_SUFFIXES:
        with_suffix = candidate.with_name(candidate.name + suffix)
        if with_suffix.is_file():
            return with_suffix
    return None


def _load_rgba(path: Path, downscale: int) -> np.ndarray:
    with Image.open(path) as image:
        image = image.convert("RGBA")
        if downscale > 1:
            image = image.resize((image.width // downscale, image.height // downscale), Image.Resampling.BOX)
        return np.asarray(image, dtype=np.uint8)


def read_transforms(root: str | Path, split: str, downscale: int = 1, max_frames: int = -1) -> PosedScene:
    """Read ``root/transforms_<split>.json`` and its images; report every missing frame at once."""
    root = Path(root).expanduser()
    transforms_path = root / f"transforms_{split}.json"
    if not transforms_path.is_file():
        available = sorted(p.name for p in root.glob("transforms_*.json")) if root.is_dir() else []
        raise SceneFormatError(
            f"no {transforms_path.name} in {root}"
            + (f" (found: {', '.join(available)})" if available else " (the folder has no transforms_*.json)")
            + ". A scene folder holds transforms_train.json, transforms_val.json, ... as in NeRF-synthetic."
        )
    try:
        meta = json.loads(transforms_path.read_text())
    except json.JSONDecodeError as error:
        raise SceneFormatError(f"{transforms_path} is not valid JSON: {error}") from None
    frames = meta.get("frames")
    if not isinstance(frames, list) or not frames:
        raise SceneFormatError(f"{transforms_path} has no 'frames' list")
    if max_frames > 0 and len(frames) > max_frames:
        keep = np.linspace(0, len(frames) - 1, max_frames).round().astype(int)
        frames = [frames[i] for i in keep]

    paths, missing = [], []
    for i, frame in enumerate(frames):
        if "file_path" not in frame or "transform_matrix" not in frame:
            raise SceneFormatError(f"{transforms_path}: frame {i} needs 'file_path' and 'transform_matrix'")
        found = _find_image(root, frame["file_path"])
        (paths if found else missing).append(found or frame["file_path"])
    if missing:
        shown = ", ".join(str(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise SceneFormatError(
            f"{len(missing)} of {len(frames)} frames listed in {transforms_path} have no image file: {shown} "
            f"(looked for {'/'.join(IMAGE_SUFFIXES[:3])} next to the paths, relative to {root})"
        )

    images = [_load_rgba(p, downscale) for p in paths]
    shapes = {im.shape for im in images}
    if len(shapes) != 1:
        raise SceneFormatError(f"images of {transforms_path} differ in size: {sorted(shapes)}")
    height, width = images[0].shape[:2]
    c2w = torch.tensor(np.array([f["transform_matrix"] for f in frames], dtype=np.float32))
    if c2w.shape[1:] == (3, 4):
        c2w = torch.cat([c2w, torch.tensor([0.0, 0.0, 0.0, 1.0]).expand(len(frames), 1, 4)], dim=1)
    if c2w.shape[1:] != (4, 4):
        raise SceneFormatError(f"{transforms_path}: transform_matrix must be 4x4 (or 3x4), got {tuple(c2w.shape[1:])}")
    intrinsics = torch.stack([_intrinsics(meta, f, width, height, downscale, transforms_path) for f in frames])
    return PosedScene(torch.from_numpy(np.stack(images)), Cameras(c2w, intrinsics, width, height), [str(p) for p in paths])


def _intrinsics(meta: dict, frame: dict, width: int, height: int, downscale: int, source: Path) -> Tensor:
    merged = {**meta, **frame}
    if "fl_x" in merged:
        fx = merged["fl_x"] / downscale
        fy = merged.get("fl_y", merged["fl_x"]) / downscale
        cx = merged.get("cx", width * downscale / 2) / downscale
        cy = merged.get("cy", height * downscale / 2) / downscale
    elif "camera_angle_x" in merged:
        fx = 0.5 * width / math.tan(0.5 * merged["camera_angle_x"])
        fy = 0.5 * height / math.tan(0.5 * merged["camera_angle_y"]) if "camera_angle_y" in merged else fx
        cx, cy = width / 2, height / 2
    else:
        raise SceneFormatError(f"{source} gives no intrinsics: add 'camera_angle_x' or 'fl_x' (+ 'fl_y', 'cx', 'cy')")
    return intrinsics_matrix(torch.tensor(fx), torch.tensor(fy), torch.tensor(cx), torch.tensor(cy))


def read_cameras(root: str | Path, split: str) -> Cameras:
    """The cameras of ``root/transforms_<split>.json`` without decoding the images (their size comes from
    the first image's header)."""
    root = Path(root).expanduser()
    path = root / f"transforms_{split}.json"
    if not path.is_file():
        raise SceneFormatError(f"no {path.name} in {root}: a scene folder holds transforms_<split>.json as in NeRF-synthetic")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SceneFormatError(f"{path} is not valid JSON: {error}") from None
    frames = meta.get("frames")
    if not isinstance(frames, list) or not frames or any("transform_matrix" not in f for f in frames):
        raise SceneFormatError(f"{path} needs a 'frames' list whose entries have 'transform_matrix'")
    first = _find_image(root, frames[0].get("file_path", ""))
    if first is None:
        raise SceneFormatError(f"{path}: the image of the first frame ({frames[0].get('file_path')}) is missing")
    with Image.open(first) as image:
        width, height = image.size
    c2w = torch.tensor(np.array([f["transform_matrix"] for f in frames], dtype=np.float32))
    if c2w.shape[1:] == (3, 4):
        c2w = torch.cat([c2w, torch.tensor([0.0, 0.0, 0.0, 1.0]).expand(len(frames), 1, 4)], dim=1)
    intrinsics = torch.stack([_intrinsics(meta, f, width, height, 1, path) for f in frames])
    return Cameras(c2w, intrinsics, width, height)


def scene_extent(cameras: Cameras) -> float:
    """Radius of the camera centres around their mean, x1.1 (the 3DGS scene-extent heuristic)."""
    positions = cameras.positions
    return float((positions - positions.mean(0)).norm(dim=-1).max()) * 1.1


@dataclass
class PosedImagesConfig:
    """A scene folder in the Blender layout and how views are served."""

    root: str = ""  # folder holding transforms_<split>.json and the images
    train_split: str = "train"  # split used for training
    val_split: str = "val"  # split used for validation metrics
    test_split: str = "orbit"  # a split name, or "orbit" for a turntable around the scene (video)
    downscale: int = 1  # integer image downscale factor
    background: list = field(default_factory=lambda: [1.0, 1.0, 1.0])  # RGB composited behind transparent pixels
    random_background: bool = False  # train on a random background colour per step (3DGS option)
    batch_mode: str = "image"  # image (whole images per step) or rays (random rays across images)
    batch_size: int = 1  # images per step in image mode
    rays_per_batch: int = 4096  # rays per step in rays mode
    max_train_frames: int = -1  # use at most this many train frames, evenly spaced (-1: all)
    max_val_views: int = -1  # evaluate at most this many val views, evenly spaced (-1: all)
    n_orbit_views: int = 120  # views in the test orbit video
    eval_batch_size: int = 1  # views per evaluation batch


@register("posed-images")
class PosedImagesDataModule(BaseDataModule):
    """Serves posed photos: whole images or ray batches for training, the val split with ground truth,
    and an orbit (or a split) for test."""

    Config = PosedImagesConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        if not self.cfg.root:
            raise SceneFormatError("data.root is empty: point it at a scene folder with transforms_*.json")
        if self.cfg.batch_mode not in ("image", "rays"):
            raise SceneFormatError(f"data.batch_mode must be image or rays, got '{self.cfg.batch_mode}'")
        self.train = read_transforms(self.cfg.root, self.cfg.train_split, self.cfg.downscale, self.cfg.max_train_frames)
        self._val: PosedScene | None = None
        self._rays: tuple[Tensor, Tensor] | None = None

    # ----- scene facts systems use (bounds, initialisation)
    @property
    def extent(self) -> float:
        return scene_extent(self.train.cameras)

    @property
    def background(self) -> Tensor:
        return torch.tensor(self.cfg.background, dtype=torch.float32)

    def val_scene(self) -> PosedScene:
        if self._val is None:
            self._val = read_transforms(self.cfg.root, self.cfg.val_split, self.cfg.downscale, self.cfg.max_val_views)
        return self._val

    # ----- training batches
    def _composite(self, rgba: Tensor, background: Tensor) -> tuple[Tensor, Tensor]:
        rgba = rgba.float() / 255.0
        alpha = rgba[..., 3:4]
        return rgba[..., :3] * alpha + background * (1 - alpha), alpha

    def _background_for(self, n: int, generator: torch.Generator) -> Tensor:
        if self.cfg.random_background:
            return torch.rand(n, 3, generator=generator)
        return self.background.expand(n, 3).clone()

    def _sample_images(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        n = len(self.train)
        index = torch.randperm(n, generator=generator)[: self.cfg.batch_size]
        background = self._background_for(len(index), generator)
        rgb, alpha = self._composite(self.train.rgba[index], background[:, None, None, :])
        return {"cameras": self.train.cameras[index], "rgb": rgb, "alpha": alpha, "background": background, "index": index, "step": step}

    def _all_rays(self) -> tuple[Tensor, Tensor]:
        if self._rays is None:
            origins, directions = self.train.cameras.rays()
            self._rays = (origins.reshape(-1, 3).contiguous(), directions.reshape(-1, 3).contiguous())
        return self._rays

    def _sample_rays(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        origins, directions = self._all_rays()
        pick = torch.randint(0, origins.shape[0], (self.cfg.rays_per_batch,), generator=generator)
        background = self._background_for(1, generator).expand(len(pick), 3)
        rgb, alpha = self._composite(self.train.rgba.reshape(-1, 4)[pick], background)
        return {"rays_o": origins[pick], "rays_d": directions[pick], "rgb": rgb, "alpha": alpha, "background": background, "step": step}

    def train_dataloader(self) -> DataLoader:
        sample = self._sample_images if self.cfg.batch_mode == "image" else self._sample_rays
        return step_loader(sample, self.base_seed, self.start_step(), self.max_steps())

    # ----- evaluation
    def _views(self, scene: PosedScene) -> list[dict[str, Any]]:
        background = self.background
        rgb, alpha = self._composite(scene.rgba, background)
        return [
            {"cameras": scene.cameras[i], "rgb": rgb[i : i + 1], "alpha": alpha[i : i + 1], "background": background[None], "index": torch.tensor([i])}
            for i in range(len(scene))
        ]

    def orbit_cameras(self, n_views: int) -> Cameras:
        """A turntable at the train cameras' mean elevation and distance, with their intrinsics."""
        elevation, _, distance = c2w_to_spherical(self.train.cameras.c2w)
        el = float(elevation.mean())
        azimuth = torch.arange(n_views, dtype=torch.float32) * (2 * math.pi / n_views)
        position = spherical_to_position(torch.full_like(azimuth, el), azimuth, torch.full_like(azimuth, float(distance.mean())))
        c2w = look_at(position, torch.zeros_like(position), torch.tensor([0.0, 0.0, 1.0]).expand_as(position))
        intrinsics = self.train.cameras.intrinsics[:1].expand(n_views, 3, 3).clone()
        return Cameras(c2w, intrinsics, self.train.cameras.width, self.train.cameras.height)

    def val_dataloader(self) -> DataLoader:
        return view_loader(self._views(self.val_scene()), self.cfg.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        if self.cfg.test_split != "orbit":
            scene = read_transforms(self.cfg.root, self.cfg.test_split, self.cfg.downscale)
            return view_loader(self._views(scene), self.cfg.eval_batch_size)
        cameras = self.orbit_cameras(self.cfg.n_orbit_views)
        background = self.background[None]
        views = [{"cameras": cameras[i], "background": background, "index": torch.tensor([i])} for i in range(len(cameras))]
        return view_loader(views, self.cfg.eval_batch_size)
