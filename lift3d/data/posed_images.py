"""Posed photos from any capture format of ``lift3d.data.formats``, served as whole images or ray batches for
training (``lift3d.data.posed_batches``) and as the held-out views for validation.

This module owns what training sees: one split of train/val frames, undistorted to pinhole, in a normalized
frame (+z up, centered where the cameras look) unless the format is object-centric (renders already in that frame).

Photos of several sizes train padded to one size (``lift3d.data.scene``): image batches carry ``loss_mask``
[B, H, W, 1] (1 = compare the pixel), which is also how ignore-masks (``mask_mode``) reach the loss; ray batches
draw only kept pixels. Validation and test views are served each at its own size, batched only with views of
the same size.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lift3d.cameras import Cameras, c2w_to_spherical, look_at, spherical_to_position
from lift3d.config import bounded, choice
from lift3d.data import formats
from lift3d.data.base import BaseDataModule, ViewList, collate_views, view_loader
from lift3d.data.capture import Capture, SceneFormatError
from lift3d.data.edited_targets import EditedTargets
from lift3d.data.formats.blender import read_cameras, read_transforms
from lift3d.data.normalize import normalizing_transform, transform_points, transform_poses
from lift3d.data.posed_batches import TrainingBatches
from lift3d.data.resident import KeptPixels, ResidentImages, ResidentRays
from lift3d.data.sample_scene import resolve_asset
from lift3d.data.scene import MASK_MODES, FrameLoader, PosedScene, check_present, read_capture, rescale_capture, split_frames
from lift3d.data.summary import SceneSummary
from lift3d.data.transforms_json import IMAGE_SUFFIXES
from lift3d.registry import register

log = logging.getLogger("lift3d.data")
__all__ = ["IMAGE_SUFFIXES", "PosedImagesDataModule", "PosedScene", "SceneFormatError", "read_cameras", "read_transforms"]


def scene_extent(cameras: Cameras) -> float:
    """Radius of the camera centers around their mean, x1.1 (the 3DGS scene-extent heuristic)."""
    positions = cameras.positions
    return float((positions - positions.mean(0)).norm(dim=-1).max()) * 1.1


@dataclass
class PosedImagesConfig:
    """A scene folder (any supported layout) and how views are served."""

    # keys renamed to one spelling per idea: the old name still loads, with a warning naming the new one
    RENAMED: ClassVar[dict[str, str]] = {"max_image_side": "max_side"}

    root: str = ""  # scene folder in a posed capture format (lift3d.data.formats: `lift3d reconstruct --help` lists them)
    # auto (from the folder's contents) or a format's name (data.format=? lists them)
    format: str = choice("auto", among=formats.config_names)
    train_split: str = "train"  # split used for training
    val_split: str = "val"  # split used for validation metrics
    # a split name, or "orbit" for the test video: a path through the training cameras (an orbit for object-centric
    # layouts: Blender renders, masked photos)
    test_split: str = "orbit"
    holdout_every: int = bounded(8, low=0)  # layouts without splits: every n-th frame (name order) is a val frame (Mip-NeRF 360)
    downscale: int = bounded(1, low=1)  # integer image downscale factor (COLMAP: images_<n>/ is used when present)
    max_side: int = bounded(0, low=0)  # raise the downscale until the longest image side is at most this (0: off)
    undistort: bool = True  # undistort lenses with distortion to pinhole once at load (false: train on them as pinhole)
    # masks (mask files or the photos' alpha): alpha (object cut-outs), ignore (masked pixels left out of loss and
    # metrics), auto (the format says: nerfstudio mask_path means ignore)
    mask_mode: str = choice("auto", among=MASK_MODES)
    # cameras (center, +z up, scale from the cameras), none, or auto (none for object-centric formats: Blender)
    normalize: str = choice("auto", "cameras", "none")
    camera_distance: float = bounded(4.0, above=0)  # normalize: the cameras' mean distance from the scene center afterwards
    triangulate: bool = False  # a real capture whose layout brings no sparse points: triangulate some at its poses (pycolmap)
    background: list = bounded([1.0, 1.0, 1.0], low=0, high=1, lengths=(3,))  # RGB composited behind transparent pixels
    random_background: bool = False  # train on a random background color per step (3DGS option)
    batch_mode: str = choice("image", "rays")  # image (whole images per step) or rays (random rays across images)
    # photos per step in image mode, per DDP rank (one render, one all-reduce); mixed sizes: loss_mask
    batch_size: int = bounded(1, low=1)
    # keep the photos on the GPU and build each batch (images or rays) there (auto: on CUDA; never: copy every step)
    images_on_device: str = choice("auto", "always", "never")
    rays_per_batch: int = bounded(4096, low=1)  # rays per step in rays mode
    # use at most this many train frames, evenly spaced (-1: all)
    max_train_frames: int = bounded(-1, low=1, allowed=(-1,), example=100)
    # evaluate at most this many val views, evenly spaced (-1: all)
    max_val_views: int = bounded(-1, low=1, allowed=(-1,), example=8)
    n_orbit_views: int = bounded(120, low=1)  # views in the test video
    video_max_side: int = bounded(1080, low=1)  # test video frames: the photos' own size, scaled down to this longest side
    eval_batch_size: int = bounded(1, low=1)  # views per evaluation batch


def _evenly(indices: list[int], limit: int) -> list[int]:
    """At most ``limit`` of ``indices``, evenly spaced (all when limit <= 0)."""
    if limit <= 0 or len(indices) <= limit:
        return list(indices)
    return [indices[i] for i in np.linspace(0, len(indices) - 1, limit).round().astype(int)]



@register("posed-images")
class PosedImagesDataModule(TrainingBatches, BaseDataModule):
    """Serves posed photos: whole images or ray batches for training, the val split with ground truth,
    and an orbit (or a split) for test."""

    Config = PosedImagesConfig
    rays_carry_index = True  # ray batches name each ray's training photo (``index`` [N]): per-photo appearance needs it

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        if not self.cfg.root:
            raise SceneFormatError(f"data.root is empty: point it at a scene folder: {formats.posed_list()}")
        root = resolve_asset(self.cfg.root)  # a path, or lift3d:NAME for a package asset
        capture, downscale = read_capture(root, self.cfg.format, self.cfg.downscale)
        check_present(capture)
        wanted = self._downscale_for(capture)
        if wanted != self.cfg.downscale:  # the capture's images for that downscale, without reading it again
            capture, downscale = rescale_capture(capture, wanted)
        self.capture = capture
        object_centric = formats.is_object_centric(capture.format)  # renders of an object, already in its frame
        c2w = np.stack([frame.c2w for frame in capture.frames])
        self.normalization, self.normalization_record = np.eye(4), {}
        if self.cfg.normalize == "cameras" or (self.cfg.normalize == "auto" and not object_centric):
            self.normalization, self.normalization_record = normalizing_transform(c2w, self.cfg.camera_distance)
            c2w = transform_poses(self.normalization, c2w)
        self.c2w = c2w
        self.splits = split_frames(capture, self.cfg.holdout_every)
        self.mask_mode = capture.mask_mode if self.cfg.mask_mode == "auto" else self.cfg.mask_mode
        self._loader = FrameLoader(capture, downscale, self.cfg.undistort, self.mask_mode)
        self.train = self._loader.load(_evenly(self._split(self.cfg.train_split), self.cfg.max_train_frames), c2w)
        if self.cfg.triangulate and capture.points is None and not object_centric and not self._has_masks():
            from lift3d.data.sfm import triangulate_points

            found = triangulate_points(capture)
            if found is not None:
                capture.points, capture.point_colors = found
        self.points, self.point_colors = self._scene_points(capture)
        self._val: PosedScene | None = None
        self._rays: tuple[Tensor, Tensor] | None = None
        # flat indices of the training pixels a ray batch may draw (None: every pixel): not padding, not ignored
        self._kept_pixels = None if self.train.keep is None else KeptPixels(self.train)
        self.targets: EditedTargets | None = None  # set by editable_targets(): training colors then come from it
        self._resident: ResidentImages | ResidentRays | None = None  # the photos on the training device
        self._log_summary(downscale)

    def _downscale_for(self, capture: Capture) -> int:
        """The configured downscale, raised until the longest side fits ``max_side``."""
        if self.cfg.max_side <= 0:
            return self.cfg.downscale
        side = max(max(f.lens.width, f.lens.height) for f in capture.frames)
        return max(self.cfg.downscale, math.ceil(side / self.cfg.max_side))

    def _has_masks(self) -> bool:
        return bool((self.train.rgba[..., 3] < 255).any())

    def _split(self, name: str) -> list[int]:
        if name not in self.splits:
            raise SceneFormatError(f"{self.cfg.root} has no split {name!r} (it has: {', '.join(self.splits)})")
        return self.splits[name]

    def _scene_points(self, capture: Capture) -> tuple[Tensor | None, Tensor | None]:
        if capture.points is None or len(capture.points) == 0:
            return None, None
        points = transform_points(self.normalization, capture.points.astype(np.float64))
        colors = capture.point_colors if capture.point_colors is not None else np.full_like(points, 128)
        return torch.tensor(points, dtype=torch.float32), torch.tensor(colors, dtype=torch.float32) / 255.0

    def _log_summary(self, downscale: int) -> None:
        capture, cams = self.capture, self.train.cameras
        split = ", ".join(f"{name} {len(indices)}" for name, indices in self.splits.items())
        how = "" if capture.splits else f" (every {self.cfg.holdout_every}th frame held out)"
        if self.train.mixed_sizes:
            sizes = sorted({self.train.size(i) for i in range(len(self.train))})
            shown = ", ".join(f"{w}x{h}" for w, h in sizes[:4]) + (" ..." if len(sizes) > 4 else "")
            images = f"images of {len(sizes)} sizes ({shown}), padded to {cams.width}x{cams.height} for training"
        else:
            images = f"images {cams.width}x{cams.height}"
        log.info("%s: %s; frames: %s%s; %s%s", capture.root.name, "; ".join(capture.notes), split, how,
                 images, f" (downscaled x{downscale})" if downscale > 1 else "")
        if self.normalization_record:
            r = self.normalization_record
            log.info("normalized the scene: center %s (%s), scale %.4g, up %s -> +z", np.round(r["center"], 3).tolist(),
                     r["center_is"], r["scale"], np.round(r["up"], 3).tolist())

    def write_records(self, run_dir: Path) -> Path:
        """``configs/scene.json`` in the run's folder: the layout read, the frames of every split, the
        normalizing transform and what the lenses became."""
        names = {split: [self.capture.frames[i].name or Path(self.capture.frames[i].image).name for i in indices]
                 for split, indices in self.splits.items()}
        record = {"root": str(self.capture.root), "format": self.capture.format, "splits": names,
                  "missing": self.capture.missing, "normalization": self.normalization.tolist(),
                  "normalization_record": self.normalization_record, "lens_notes": sorted(self._loader.reported),
                  "image_size": [self.train.cameras.width, self.train.cameras.height], "mask_mode": self.mask_mode}
        if self.train.mixed_sizes:
            record["image_sizes"] = {path: list(self.train.size(i)) for i, path in enumerate(self.train.paths)}
        path = Path(run_dir) / "configs" / "scene.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
        return path

    # ----- scene facts systems use (bounds, initialization)
    @property
    def extent(self) -> float:
        return scene_extent(self.train.cameras)

    @property
    def background(self) -> Tensor:
        return torch.tensor(self.cfg.background, dtype=torch.float32)

    def scene_summary(self) -> SceneSummary:
        """The training photos, their cameras, sizes and sparse points, the scene's extent and the edit target store."""
        train = self.train
        return SceneSummary(cameras=train.cameras, image_sizes=tuple(train.size(i) for i in range(len(train))),
                            images=train.rgba, extent=self.extent, points=self.points, point_colors=self.point_colors,
                            background=self.background, capture_format=self.capture.format,
                            object_centric=formats.is_object_centric(self.capture.format),
                            batches_name_their_photos=self.cfg.batch_mode != "rays" or self.rays_carry_index,
                            edit_targets=self.editable_targets,
                            world_from_capture=torch.as_tensor(self.normalization, dtype=torch.float64))

    def val_scene(self) -> PosedScene:
        if self._val is None:
            self._val = self._loader.load(_evenly(self._split(self.cfg.val_split), self.cfg.max_val_views), self.c2w)
        return self._val

    # ----- evaluation
    def _views(self, scene: PosedScene) -> list[dict[str, Any]]:
        """One evaluation view per photo, at its own size; ``loss_mask`` [1, h, w, 1] where pixels are ignored."""
        background = self.background
        views = []
        for i in range(len(scene)):
            rgba, cameras, keep = scene.view(i)
            rgb, alpha = self._composite(rgba, background)
            view = {"cameras": cameras, "rgb": rgb, "alpha": alpha, "background": background[None], "index": torch.tensor([i])}
            if keep is not None:
                view["loss_mask"] = keep[..., None].float()
            views.append(view)
        return views

    def _view_loader(self, views: list[dict[str, Any]]) -> DataLoader:
        """Evaluation batches of ``eval_batch_size`` views, each batch of one image size (and the same keys)."""
        kinds = {(v["cameras"].width, v["cameras"].height, "loss_mask" in v) for v in views}
        if self.cfg.eval_batch_size <= 1 or len(kinds) <= 1:
            return view_loader(views, self.cfg.eval_batch_size)
        batches: list[list[int]] = []
        for i, v in enumerate(views):
            last = views[batches[-1][0]] if batches else None
            same = last is not None and (last["cameras"].width, last["cameras"].height, "loss_mask" in last) == (
                v["cameras"].width, v["cameras"].height, "loss_mask" in v)
            if same and len(batches[-1]) < self.cfg.eval_batch_size:
                batches[-1].append(i)
            else:
                batches.append([i])
        return DataLoader(ViewList(views), batch_sampler=batches, num_workers=0, collate_fn=collate_views)

    def orbit_cameras(self, n_views: int, size: tuple[int, int] | None = None) -> Cameras:
        """A turntable at the train cameras' mean elevation and distance, with their intrinsics, at ``size`` (width,
        height; default the first photo's)."""
        elevation, _, distance = c2w_to_spherical(self.train.cameras.c2w)
        el = float(elevation.mean())
        azimuth = torch.arange(n_views, dtype=torch.float32) * (2 * math.pi / n_views)
        position = spherical_to_position(torch.full_like(azimuth, el), azimuth, torch.full_like(azimuth, float(distance.mean())))
        c2w = look_at(position, torch.zeros_like(position), torch.tensor([0.0, 0.0, 1.0]).expand_as(position))
        intrinsics = self.train.cameras.intrinsics[:1].expand(n_views, 3, 3).clone()
        orbit = Cameras(c2w, intrinsics, *self.train.size(0))
        return orbit if size is None else orbit.resized(*size)

    def video_size(self) -> tuple[int, int]:
        """(width, height) of the test video: the training photos' most common size as read (before any training
        downscale), its longest side at most ``video_max_side``, even (H.264)."""
        from collections import Counter

        lenses = [self.capture.frames[i].lens for i in self._split(self.cfg.train_split)]
        width, height = Counter((lens.width, lens.height) for lens in lenses).most_common(1)[0][0]
        scale = min(1.0, self.cfg.video_max_side / max(width, height))
        return max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2)

    def video_cameras(self, n_views: int) -> Cameras:
        """The test video's cameras at ``video_size``: an orbit for object-centric layouts (Blender renders, masked
        photos), else a smooth path through the training cameras (``lift3d.camera_paths``), out and back unless the
        photos go all around: the video shows what the photos saw, not the side nobody photographed."""
        from lift3d.camera_paths import camera_path_through

        size = self.video_size()
        if formats.is_object_centric(self.capture.format) or (self.mask_mode == "alpha" and self._has_masks()):
            return self.orbit_cameras(n_views, size)
        return camera_path_through(self.train.cameras, n_views, *size, there_and_back=True)

    def val_dataloader(self) -> DataLoader:
        return self._view_loader(self._views(self.val_scene()))

    def test_dataloader(self) -> DataLoader:
        if self.cfg.test_split != "orbit":
            scene = self._loader.load(self._split(self.cfg.test_split), self.c2w)
            return self._view_loader(self._views(scene))
        cameras = self.video_cameras(self.cfg.n_orbit_views)
        background = self.background[None]
        views = [{"cameras": cameras[i], "background": background, "index": torch.tensor([i])} for i in range(len(cameras))]
        return view_loader(views, self.cfg.eval_batch_size)
