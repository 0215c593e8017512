"""Posed photos from any supported layout (Blender, nerfstudio / instant-ngp ``transforms.json``, COLMAP),
served as whole images or ray batches for training and as the held-out views for validation.

The readers live beside this module (``lift3d.data.scene`` picks one); this module owns what training
sees: one split of train/val frames, undistorted to pinhole, in a normalised frame (+z up, centred
where the cameras look) unless the layout is an object scene already in that frame (Blender).

Photos of several sizes train padded to one size (``lift3d.data.scene``): image batches carry ``loss_mask``
[B, H, W, 1] (1 = compare the pixel), which is also how ignore-masks (``mask_mode``) reach the loss; ray batches
draw only kept pixels. Validation and test views are served each at its own size, batched only with views of
the same size.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lift3d.cameras import Cameras, c2w_to_spherical, look_at, spherical_to_position
from lift3d.config import ConfigError
from lift3d.data.base import BaseDataModule, ViewList, collate_views, step_loader, view_loader
from lift3d.data.capture import Capture, SceneFormatError
from lift3d.data.edited_targets import EditedTargets
from lift3d.data.normalize import normalizing_transform, transform_points, transform_poses
from lift3d.data.scene import MASK_MODES, FrameLoader, PosedScene, check_present, read_capture, split_frames
from lift3d.data.transforms_json import IMAGE_SUFFIXES, read_blender
from lift3d.registry import register
from lift3d.rng import step_generator

log = logging.getLogger("lift3d.data")
__all__ = ["IMAGE_SUFFIXES", "PosedImagesDataModule", "PosedScene", "SceneFormatError", "read_cameras", "read_transforms"]


def read_transforms(root: str | Path, split: str, downscale: int = 1, max_frames: int = -1) -> PosedScene:
    """One split of a Blender-layout scene (``root/transforms_<split>.json`` and its images), poses as stored."""
    root = Path(root).expanduser()
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
    root = Path(root).expanduser()
    if not (root / f"transforms_{split}.json").is_file():
        raise SceneFormatError(f"no transforms_{split}.json in {root}: a scene folder holds transforms_<split>.json as in NeRF-synthetic")
    capture = read_blender(root, (split,))
    if not capture.frames:
        raise SceneFormatError(f"{root / f'transforms_{split}.json'}: the image of the first frame is missing")
    lenses = [f.lens for f in capture.frames]
    intrinsics = torch.tensor(np.stack([lens.matrix() for lens in lenses]), dtype=torch.float32)
    c2w = torch.tensor(np.stack([f.c2w for f in capture.frames]), dtype=torch.float32)
    return Cameras(c2w, intrinsics, lenses[0].width, lenses[0].height)


def scene_extent(cameras: Cameras) -> float:
    """Radius of the camera centres around their mean, x1.1 (the 3DGS scene-extent heuristic)."""
    positions = cameras.positions
    return float((positions - positions.mean(0)).norm(dim=-1).max()) * 1.1


@dataclass
class PosedImagesConfig:
    """A scene folder (any supported layout) and how views are served."""

    root: str = ""  # scene folder: Blender (transforms_*.json), nerfstudio / instant-ngp (transforms.json) or COLMAP (sparse/0 + images/)
    format: str = "auto"  # auto (from the folder's contents), blender, nerfstudio, instant-ngp or colmap
    train_split: str = "train"  # split used for training
    val_split: str = "val"  # split used for validation metrics
    test_split: str = "orbit"  # a split name, or "orbit" for a turntable around the scene (video)
    holdout_every: int = 8  # layouts without splits: every n-th frame (name order) is a val frame (Mip-NeRF 360)
    downscale: int = 1  # integer image downscale factor (COLMAP: images_<n>/ is used when present)
    max_image_side: int = 0  # raise the downscale until the longest image side is at most this (0: off)
    undistort: bool = True  # undistort lenses with distortion to pinhole once at load (false: train on them as pinhole)
    mask_mode: str = "auto"  # masks (mask files or the photos' alpha): alpha (object cut-outs), ignore (masked pixels left out of loss and metrics), auto (the format says: nerfstudio mask_path means ignore)
    normalize: str = "auto"  # cameras (centre, +z up, scale from the cameras), none, or auto (none for Blender scenes)
    camera_distance: float = 4.0  # normalize: the cameras' mean distance from the scene centre afterwards
    triangulate: bool = False  # a real capture whose layout brings no sparse points: triangulate some at its poses (pycolmap)
    background: list = field(default_factory=lambda: [1.0, 1.0, 1.0])  # RGB composited behind transparent pixels
    random_background: bool = False  # train on a random background colour per step (3DGS option)
    batch_mode: str = "image"  # image (whole images per step) or rays (random rays across images)
    batch_size: int = 1  # photos per step in image mode, per DDP rank (one render, one all-reduce); mixed sizes: see loss_mask
    images_on_device: str = "auto"  # keep the photos on the GPU and build each batch (images or rays) there (auto: on CUDA; never: copy every step)
    rays_per_batch: int = 4096  # rays per step in rays mode
    max_train_frames: int = -1  # use at most this many train frames, evenly spaced (-1: all)
    max_val_views: int = -1  # evaluate at most this many val views, evenly spaced (-1: all)
    n_orbit_views: int = 120  # views in the test orbit video
    eval_batch_size: int = 1  # views per evaluation batch


def check_values(cfg: PosedImagesConfig) -> None:
    """Refuse values outside their range with the key named (a zero downscale or batch would fail deep inside)."""
    at_least_one = ("downscale", "batch_size", "rays_per_batch", "eval_batch_size", "n_orbit_views")
    for key in at_least_one:
        value = getattr(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"data.{key} must be a whole number of at least 1, got {value!r}")
    for key in ("holdout_every", "max_image_side"):
        value = getattr(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"data.{key} must be a whole number of at least 0 (0: off), got {value!r}")
    for key in ("max_train_frames", "max_val_views"):
        value = getattr(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
            raise ConfigError(f"data.{key} must be -1 (all) or a whole number of at least 1, got {value!r}")
    if not cfg.camera_distance > 0:
        raise ConfigError(f"data.camera_distance must be above 0, got {cfg.camera_distance!r}")
    if cfg.mask_mode not in MASK_MODES:
        raise ConfigError(f"data.mask_mode must be one of {', '.join(MASK_MODES)}, got {cfg.mask_mode!r}")


def _evenly(indices: list[int], limit: int) -> list[int]:
    """At most ``limit`` of ``indices``, evenly spaced (all when limit <= 0)."""
    if limit <= 0 or len(indices) <= limit:
        return list(indices)
    return [indices[i] for i in np.linspace(0, len(indices) - 1, limit).round().astype(int)]


def fits_on_device(n_bytes: int, device: torch.device) -> bool:
    """Whether ``n_bytes`` of training data take at most a quarter of the device's memory (any size off CUDA)."""
    if device.type != "cuda":
        return True
    return n_bytes <= torch.cuda.get_device_properties(device).total_memory // 4


class DrawnAhead:
    """What the loader would draw for each step (``draw(step, generator)`` -> tensors, with the step's generator),
    drawn on the host for a block of steps at once and kept on the training device: the same draws as the host
    loader's, with one upload per block instead of a page-locked copy per step."""

    BLOCK = 512  # steps drawn and uploaded at once

    def __init__(self, draw: Any, seed: int, device: torch.device) -> None:
        self.draw, self.seed, self.device = draw, seed, device
        self._first = -1
        self._drawn: tuple[Tensor, ...] = ()

    def __call__(self, step: int) -> tuple[Tensor, ...]:
        """The draws of ``step`` on the device."""
        if not self._drawn or not self._first <= step < self._first + self.BLOCK:
            draws = [self.draw(s, step_generator(self.seed, s)) for s in range(step, step + self.BLOCK)]
            self._first = step
            self._drawn = tuple(torch.stack(parts).to(self.device) for parts in zip(*draws))
        return tuple(parts[step - self._first] for parts in self._drawn)


class ResidentImages:
    """The training photos and cameras on the training device, and the views of each step drawn ahead in blocks:
    a step's batch is then a few gathers on the device, with no host-to-device copy (or page-locking) per step,
    which on a GPU costs more host time than the step's kernels."""

    BLOCK = DrawnAhead.BLOCK

    COMPOSITE_BYTES = 1 << 30  # with a fixed background, photos up to this size as floats are composited once

    def __init__(self, scene: PosedScene, device: torch.device, pick: Any, seed: int,
                 composite: Any = None, background: Tensor | None = None) -> None:
        self.rgba = scene.rgba.to(device)
        self.keep = None if scene.keep is None else scene.keep.to(device)
        self.c2w = scene.cameras.c2w.to(device)
        self.intrinsics = scene.cameras.intrinsics.to(device)
        self.viewmats = scene.cameras.w2c_opencv().to(device)
        # (rgb, alpha) on the one training background, when it is fixed and they fit: no compositing per step
        self.composited: tuple[Tensor, Tensor] | None = None
        if composite is not None and background is not None and self.rgba.numel() * 4 <= self.COMPOSITE_BYTES:
            self.composited = composite(self.rgba, background.to(device))
        self.pick = DrawnAhead(pick, seed, device)


class ResidentRays:
    """Ray batches built on the training device: every training pixel's ray and colour kept there, and the pixels
    of each step drawn ahead in blocks (``DrawnAhead``): a step's batch is a few gathers, with no host work or
    copy per step (on a GPU, the host's sampling, compositing and copying cost more than the NeRF step's kernels)."""

    def __init__(self, origins: Tensor, directions: Tensor, rgba: Tensor, device: torch.device, pick: Any,
                 seed: int) -> None:
        self.origins, self.directions = origins.to(device), directions.to(device)
        self.rgba = rgba.reshape(-1, 4).to(device)
        self.pick = DrawnAhead(pick, seed, device)

    BYTES_PER_PIXEL = 28  # a ray (origin and direction, float32) and its RGBA bytes


class KeptPixels:
    """The kept pixels of a padded or masked training set, numbered 0..len-1 in order, and ``flat(k)``: where the
    k-th lies among every stored pixel. Padding alone is arithmetic (each photo's own rows); ignore-masks need a
    table of the kept pixels (int32 where it fits: 4 bytes a kept pixel)."""

    def __init__(self, scene: PosedScene) -> None:
        assert scene.keep is not None
        n, self.height, self.width = scene.keep.shape
        sizes = scene.sizes if scene.sizes is not None else torch.tensor([[self.width, self.height]] * n)
        self.widths = sizes[:, 0].clone()
        counts = sizes[:, 0] * sizes[:, 1]
        padding_only = bool((scene.keep.reshape(n, -1).sum(1) == counts).all())  # every pixel of every photo kept
        self.ends = counts.cumsum(0)
        self.starts = self.ends - counts
        self.table: Tensor | None = None
        if not padding_only:
            table = scene.keep.reshape(-1).nonzero().squeeze(1)
            self.table = table.int() if scene.keep.numel() < 2**31 else table
        self.total = int(self.ends[-1]) if self.table is None else len(self.table)

    def __len__(self) -> int:
        return self.total

    def flat(self, k: Tensor) -> Tensor:
        """Flat indices into every stored pixel ([N * H * W]) of kept pixels ``k`` [R]."""
        if self.table is not None:
            return self.table[k].long()
        image = torch.searchsorted(self.ends, k, right=True)
        within = k - self.starts[image]
        width = self.widths[image]
        return (image * self.height + within // width) * self.width + within % width


@register("posed-images")
class PosedImagesDataModule(BaseDataModule):
    """Serves posed photos: whole images or ray batches for training, the val split with ground truth,
    and an orbit (or a split) for test."""

    Config = PosedImagesConfig
    rays_carry_index = True  # ray batches name each ray's training photo (``index`` [N]): per-photo appearance needs it

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        if not self.cfg.root:
            raise SceneFormatError("data.root is empty: point it at a scene folder (transforms_*.json, transforms.json "
                                   "or a COLMAP sparse/ model)")
        if self.cfg.batch_mode not in ("image", "rays"):
            raise SceneFormatError(f"data.batch_mode must be image or rays, got '{self.cfg.batch_mode}'")
        if self.cfg.images_on_device not in ("auto", "always", "never"):
            raise SceneFormatError(f"data.images_on_device must be auto, always or never, got '{self.cfg.images_on_device}'")
        if self.cfg.normalize not in ("auto", "cameras", "none"):
            raise SceneFormatError(f"data.normalize must be auto, cameras or none, got '{self.cfg.normalize}'")
        check_values(self.cfg)
        root = Path(self.cfg.root).expanduser()
        capture, downscale = read_capture(root, self.cfg.format, self.cfg.downscale)
        check_present(capture)
        wanted = self._downscale_for(capture)
        if wanted != self.cfg.downscale:
            capture, downscale = read_capture(root, self.cfg.format, wanted)
        self.capture = capture
        c2w = np.stack([frame.c2w for frame in capture.frames])
        self.normalization, self.normalization_record = np.eye(4), {}
        if self.cfg.normalize == "cameras" or (self.cfg.normalize == "auto" and capture.format != "blender"):
            self.normalization, self.normalization_record = normalizing_transform(c2w, self.cfg.camera_distance)
            c2w = transform_poses(self.normalization, c2w)
        self.c2w = c2w
        self.splits = split_frames(capture, self.cfg.holdout_every)
        self.mask_mode = capture.mask_mode if self.cfg.mask_mode == "auto" else self.cfg.mask_mode
        self._loader = FrameLoader(capture, downscale, self.cfg.undistort, self.mask_mode)
        self.train = self._loader.load(_evenly(self._split(self.cfg.train_split), self.cfg.max_train_frames), c2w)
        if self.cfg.triangulate and capture.points is None and capture.format != "blender" and not self._has_masks():
            from lift3d.data.sfm import triangulate_points

            found = triangulate_points(capture)
            if found is not None:
                capture.points, capture.point_colors = found
        self.points, self.point_colors = self._scene_points(capture)
        self._val: PosedScene | None = None
        self._rays: tuple[Tensor, Tensor] | None = None
        # flat indices of the training pixels a ray batch may draw (None: every pixel): not padding, not ignored
        self._kept_pixels = None if self.train.keep is None else KeptPixels(self.train)
        self.targets: EditedTargets | None = None  # set by editable_targets(): training colours then come from it
        self._resident: ResidentImages | ResidentRays | None = None  # the photos on the training device (images_on_device)
        self._log_summary(downscale)

    def _downscale_for(self, capture: Capture) -> int:
        """The configured downscale, raised until the longest side fits ``max_image_side``."""
        if self.cfg.max_image_side <= 0:
            return self.cfg.downscale
        side = max(max(f.lens.width, f.lens.height) for f in capture.frames)
        return max(self.cfg.downscale, math.ceil(side / self.cfg.max_image_side))

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
            log.info("normalised the scene: centre %s (%s), scale %.4g, up %s -> +z", np.round(r["centre"], 3).tolist(),
                     r["centre_is"], r["scale"], np.round(r["up"], 3).tolist())

    def write_records(self, trial_dir: Path) -> Path:
        """``configs/scene.json`` in the run's folder: the layout read, the frames of every split, the
        normalising transform and what the lenses became."""
        names = {split: [self.capture.frames[i].name or Path(self.capture.frames[i].image).name for i in indices]
                 for split, indices in self.splits.items()}
        record = {"root": str(self.capture.root), "format": self.capture.format, "splits": names,
                  "missing": self.capture.missing, "normalization": self.normalization.tolist(),
                  "normalization_record": self.normalization_record, "lens_notes": sorted(self._loader.reported),
                  "image_size": [self.train.cameras.width, self.train.cameras.height], "mask_mode": self.mask_mode}
        if self.train.mixed_sizes:
            record["image_sizes"] = {path: list(self.train.size(i)) for i, path in enumerate(self.train.paths)}
        path = Path(trial_dir) / "configs" / "scene.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
        return path

    # ----- scene facts systems use (bounds, initialisation)
    @property
    def extent(self) -> float:
        return scene_extent(self.train.cameras)

    @property
    def background(self) -> Tensor:
        return torch.tensor(self.cfg.background, dtype=torch.float32)

    def val_scene(self) -> PosedScene:
        if self._val is None:
            self._val = self._loader.load(_evenly(self._split(self.cfg.val_split), self.cfg.max_val_views), self.c2w)
        return self._val

    # ----- training batches
    def editable_targets(self) -> EditedTargets:
        """The store of training targets an editing run rewrites (created on first call from the photos on the
        training background); from then on every training batch reads its colours from it."""
        if self.targets is None:
            if self.cfg.random_background:
                raise SceneFormatError("editing a reconstruction needs a fixed training background (edited views are "
                                       "composited images): set data.random_background=false")
            self.targets = EditedTargets(*self._composite(self.train.rgba, self.background), self.background)
        return self.targets

    def _composite(self, rgba: Tensor, background: Tensor) -> tuple[Tensor, Tensor]:
        rgba = rgba.float() / 255.0
        alpha = rgba[..., 3:4]
        return rgba[..., :3] * alpha + background * (1 - alpha), alpha

    def _background_for(self, n: int, generator: torch.Generator) -> Tensor:
        if self.cfg.random_background:
            return torch.rand(n, 3, generator=generator)
        return self.background.expand(n, 3).clone()

    def _sample_images(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        """A whole-image training batch: cameras, ``rgb`` on its background, ``alpha``, ``background``, ``index``."""
        return self.finish_image_batch(self._pick_images(step, generator))

    def _pick(self, step: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The training views of ``step`` and their background colours: what every image batch is built from."""
        index = torch.randperm(len(self.train), generator=generator)[: self.cfg.batch_size]
        return index, self._background_for(len(index), generator)

    def _pick_images(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        """What the loader yields for an image batch: the photos as stored (uint8 RGBA, and the edited targets when
        there are any), composited only after the copy to the device (``on_after_batch_transfer``). A quarter of the
        bytes to copy, and no per-step float work on the host, which feeds the GPU one step at a time."""
        index, background = self._pick(step, generator)
        batch = {"cameras": self.train.cameras[index], "rgba": self.train.rgba[index],
                 "background": background, "index": index, "step": step}
        if self.train.keep is not None:
            batch["keep"] = self.train.keep[index]
        if self.targets is not None:
            batch["target_rgb"] = self.targets.rgb[index]
        return batch

    def finish_image_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``_pick_images``'s batch with ``rgb`` [B, H, W, 3] and ``alpha`` [B, H, W, 1] in 0..1 in place of the
        stored bytes (and ``loss_mask`` [B, H, W, 1] in place of the kept pixels), on whatever device the batch is on
        (other batches pass through)."""
        if "keep" in batch:
            batch = dict(batch)
            batch["loss_mask"] = batch.pop("keep")[..., None].float()
        if "rgba" not in batch:
            return batch
        batch = dict(batch)
        rgba, target = batch.pop("rgba"), batch.pop("target_rgb", None)
        rgb, alpha = self._composite(rgba, batch["background"][:, None, None, :])
        if target is not None:
            rgb = target.float() / 255.0
        return {**batch, "rgb": rgb, "alpha": alpha}

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning's hook after the copy to the device: build a resident batch from its step, or composite the
        copied photos there."""
        if isinstance(batch, dict) and self._resident is not None and batch.keys() == {"step"}:
            if isinstance(self._resident, ResidentRays):
                return self._resident_rays(batch["step"])
            return self.finish_image_batch(self._resident_batch(batch["step"]))
        return self.finish_image_batch(batch) if isinstance(batch, dict) else batch

    def _training_device(self) -> torch.device | None:
        trainer = self.trainer
        return trainer.strategy.root_device if trainer is not None else None

    def _use_resident_images(self, device: torch.device | None) -> bool:
        """Whether batches are built on the training device from resident photos (images_on_device); with "auto",
        on CUDA where the photos (and, for ray batches, every pixel's ray) fit in a quarter of its memory."""
        mode = self.cfg.images_on_device
        if mode == "never" or device is None or (mode == "auto" and device.type != "cuda"):
            return False
        per_pixel = ResidentRays.BYTES_PER_PIXEL if self.cfg.batch_mode == "rays" else 4
        return mode == "always" or fits_on_device(self.train.rgba[..., 0].numel() * per_pixel, device)

    def _resident_batch(self, step: int) -> dict[str, Any]:
        """The image batch of ``step`` gathered on the device from the resident photos: the same views and
        backgrounds as the loader's host batches (``_pick`` with the step's generator), with no copy per step."""
        r = self._resident
        assert isinstance(r, ResidentImages)
        index, background = r.pick(step)
        batch = {"cameras": Cameras(r.c2w.index_select(0, index), r.intrinsics.index_select(0, index),
                                    self.train.cameras.width, self.train.cameras.height, r.viewmats.index_select(0, index)),
                 "background": background, "index": index, "step": step}
        if self.targets is not None:  # an editing run rewrites these on the host: copied per step
            batch["target_rgb"] = self.targets.rgb[index.cpu()].to(r.rgba.device)
        if r.keep is not None:
            batch["keep"] = r.keep.index_select(0, index)
        if r.composited is not None and self.targets is None:
            rgb, alpha = r.composited
            return self.finish_image_batch({**batch, "rgb": rgb.index_select(0, index), "alpha": alpha.index_select(0, index)})
        return {**batch, "rgba": r.rgba.index_select(0, index)}

    def _all_rays(self) -> tuple[Tensor, Tensor]:
        if self._rays is None:
            origins, directions = self.train.cameras.rays()
            self._rays = (origins.reshape(-1, 3).contiguous(), directions.reshape(-1, 3).contiguous())
        return self._rays

    def _pick_rays(self, step: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The training pixels of ``step`` (flat indices into every photo's pixels, drawn among the kept ones: never
        padding or ignored pixels) and their background colour [1, 3]: what every ray batch is built from."""
        kept = self._kept_pixels
        pick = torch.randint(0, self.train.rgba[..., 0].numel() if kept is None else len(kept), (self.cfg.rays_per_batch,),
                             generator=generator)
        return (pick if kept is None else kept.flat(pick)), self._background_for(1, generator)

    def _sample_rays(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        origins, directions = self._all_rays()
        pick, background = self._pick_rays(step, generator)
        # a real [N, 3] tensor, not an expanded view: the loader pins batches on CUDA, which refuses overlapping memory
        background = background.expand(len(pick), 3).contiguous()
        rgb, alpha = self._composite(self.train.rgba.reshape(-1, 4)[pick], background)
        if self.targets is not None:
            rgb = self.targets.pixels(pick)
        return {"rays_o": origins[pick], "rays_d": directions[pick], "rgb": rgb, "alpha": alpha, "background": background,
                "index": self._photo_of(pick), "step": step}

    def _photo_of(self, pick: Tensor) -> Tensor:
        """The training photo [N] of each flat pixel index ``pick`` [N] (every photo spans the padded H x W)."""
        height, width = self.train.rgba.shape[1:3]
        return torch.div(pick, height * width, rounding_mode="floor")

    def _resident_rays(self, step: int) -> dict[str, Any]:
        """The ray batch of ``step`` gathered on the device from the resident rays and colours: the same pixels,
        background and values as the loader's host batches (``_sample_rays``), with no copy per step."""
        r = self._resident
        assert isinstance(r, ResidentRays)
        pick, background = r.pick(step)
        background = background.expand(len(pick), 3)
        rgb, alpha = self._composite(r.rgba.index_select(0, pick), background)
        if self.targets is not None:  # an editing run rewrites these on the host: copied per step
            rgb = self.targets.pixels(pick.cpu()).to(rgb.device)
        return {"rays_o": r.origins.index_select(0, pick), "rays_d": r.directions.index_select(0, pick), "rgb": rgb,
                "alpha": alpha, "background": background, "index": self._photo_of(pick), "step": step}

    def train_dataloader(self) -> DataLoader:
        device = self._training_device()
        if self._use_resident_images(device):
            assert device is not None
            if self.cfg.batch_mode == "rays":
                self._resident = ResidentRays(*self._all_rays(), self.train.rgba, device, self._pick_rays, self.base_seed)
                self._rays = None  # the device holds every ray now: no host copy kept (384 MB for lego at 400x400)
            else:
                fixed = None if self.cfg.random_background else self.background
                self._resident = ResidentImages(self.train, device, self._pick, self.base_seed, self._composite, fixed)
            return step_loader(lambda step, generator: {"step": step}, self.base_seed, self.start_step(), self.max_steps())
        self._resident = None
        sample = self._pick_images if self.cfg.batch_mode == "image" else self._sample_rays
        return step_loader(sample, self.base_seed, self.start_step(), self.max_steps())

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
        if self.cfg.eval_batch_size <= 1 or len({(v["cameras"].width, v["cameras"].height, "loss_mask" in v) for v in views}) <= 1:
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

    def orbit_cameras(self, n_views: int) -> Cameras:
        """A turntable at the train cameras' mean elevation and distance, with their intrinsics."""
        elevation, _, distance = c2w_to_spherical(self.train.cameras.c2w)
        el = float(elevation.mean())
        azimuth = torch.arange(n_views, dtype=torch.float32) * (2 * math.pi / n_views)
        position = spherical_to_position(torch.full_like(azimuth, el), azimuth, torch.full_like(azimuth, float(distance.mean())))
        c2w = look_at(position, torch.zeros_like(position), torch.tensor([0.0, 0.0, 1.0]).expand_as(position))
        intrinsics = self.train.cameras.intrinsics[:1].expand(n_views, 3, 3).clone()
        return Cameras(c2w, intrinsics, *self.train.size(0))

    def val_dataloader(self) -> DataLoader:
        return self._view_loader(self._views(self.val_scene()))

    def test_dataloader(self) -> DataLoader:
        if self.cfg.test_split != "orbit":
            scene = self._loader.load(self._split(self.cfg.test_split), self.c2w)
            return self._view_loader(self._views(scene))
        cameras = self.orbit_cameras(self.cfg.n_orbit_views)
        background = self.background[None]
        views = [{"cameras": cameras[i], "background": background, "index": torch.tensor([i])} for i in range(len(cameras))]
        return view_loader(views, self.cfg.eval_batch_size)
