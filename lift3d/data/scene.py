"""A scene folder in any supported layout -> posed, undistorted, normalized images split into train and val.

``detect`` finds the folder's format in the table of ``lift3d.data.formats``; ``read_capture`` runs its reader;
``FrameLoader`` reads the pixels (EXIF-upright, undistorted to pinhole once, downscaled) into a
``PosedScene``; ``split_frames`` holds out every n-th frame when the format has no splits of its own.

Every photo keeps its own size and intrinsics. Photos of one size stack as they are; photos of several sizes
(several cameras, portrait and landscape, COLMAP's undistorted folders where every image has its own crop) are
padded at the right and bottom to the largest width and height, with each camera's intrinsics unchanged (the
principal point is measured from the top-left corner), and ``keep`` marks the padding as pixels no loss or metric
reads. Ignore-masks (``mask_mode="ignore"``) are also ``keep``: the pixels they mask are never compared.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.cameras import Cameras, intrinsics_matrix
from lift3d.data import formats
from lift3d.data.capture import Capture, Lens, SceneFormatError
from lift3d.data.formats import CaptureFormat
from lift3d.data.images import load_mask, load_rgba
from lift3d.data.undistort import Undistortion, plan_undistortion

log = logging.getLogger("lift3d.data")
MASK_MODES = ("auto", "alpha", "ignore")


@dataclass
class PosedScene:
    """One split of a scene: images and the cameras that took them (see the module's docstring for mixed sizes)."""

    rgba: Tensor  # [N, H, W, 4] uint8 (alpha 255 for RGB photos); smaller photos padded at the right and bottom (opaque black)
    cameras: Cameras  # N cameras, OpenGL c2w, of the common (padded) size; each camera's intrinsics are its own photo's
    paths: list[str]
    sizes: Tensor | None = None  # [N, 2] int64 (width, height) of each photo inside the padding; None: every photo fills W x H
    keep: Tensor | None = None  # [N, H, W] bool: pixels the loss and metrics read (False: padding, ignored); None: every pixel

    def __len__(self) -> int:
        return self.rgba.shape[0]

    def size(self, i: int) -> tuple[int, int]:
        """(width, height) of photo ``i`` as it was taken (without padding)."""
        if self.sizes is None:
            return self.cameras.width, self.cameras.height
        width, height = self.sizes[i].tolist()
        return int(width), int(height)

    @property
    def mixed_sizes(self) -> bool:
        return self.sizes is not None

    def view(self, i: int) -> tuple[Tensor, Cameras, Tensor | None]:
        """Photo ``i`` at its own size: rgba [1, h, w, 4], its camera, and its kept pixels [1, h, w] (None: all)."""
        width, height = self.size(i)
        camera = self.cameras[i]
        keep = None if self.keep is None else self.keep[i : i + 1, :height, :width]
        if keep is not None and bool(keep.all()):
            keep = None
        return self.rgba[i : i + 1, :height, :width], Cameras(camera.c2w, camera.intrinsics, width, height), keep


def detect(root: Path) -> CaptureFormat:
    """The posed format ``root`` holds (``lift3d.data.formats``, first by priority); SceneFormatError lists them."""
    found = formats.detect(root)
    if found is not None and found.posed:
        return found
    if not root.is_dir():
        what = found.description if found is not None else "a folder"
        raise SceneFormatError(f"{root} is not {what} lift3d can read" + ("" if root.exists() else " (it does not exist)"))
    raise SceneFormatError(
        f"{root} holds no poses lift3d can read. A scene folder is one of: {formats.posed_list()}; "
        f"{formats.unposed_list()}, gets its poses from structure from motion (`lift3d poses PATH`)")


def detect_format(root: Path) -> str:
    """The name of the posed format ``root`` holds (``detect``)."""
    return detect(root).name


def read_capture(root: Path, format: str = "auto", downscale: int = 1) -> tuple[Capture, int]:
    """The capture in ``root`` read by the reader of ``format`` (a ``data.format`` value; ``auto``: detected),
    and the downscale left to apply to its images when they are read."""
    if format not in formats.config_names():
        raise SceneFormatError(f"data.format must be one of {', '.join(formats.config_names())}, got {format!r}")
    record = detect(root) if format == "auto" else formats.by_config_name(format)
    assert record.read is not None
    capture, downscale = record.read(root, downscale)
    check_finite(capture)
    return capture, downscale


def rescale_capture(capture: Capture, downscale: int) -> tuple[Capture, int]:
    """``capture`` for another downscale without re-reading it (COLMAP picks its ``images_<n>/`` again), and the
    downscale left to apply to its images."""
    record = formats.by_name(capture.format)
    return record.rescale(capture, downscale) if record.rescale is not None else (capture, downscale)


def check_finite(capture: Capture) -> None:
    """Refuse camera poses or lenses holding NaN or infinite numbers (a broken export, a failed solve), naming the
    frames, before any training: they would turn every Gaussian or field they touch into NaN."""
    bad = []
    for frame in capture.frames:
        lens = frame.lens
        if not (np.isfinite(frame.c2w).all() and np.isfinite([lens.fx, lens.fy, lens.cx, lens.cy, *lens.coeffs]).all()):
            bad.append(frame.name or frame.image.name)
    if bad:
        shown = ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise SceneFormatError(f"{len(bad)} of {len(capture.frames)} frames in {capture.root} have camera poses or lenses "
                               f"that are not finite numbers (NaN or inf): {shown}; fix or remove those frames in its poses "
                               f"file, or recover every pose again with lift3d poses {capture.root} --force")


def check_present(capture: Capture) -> None:
    """Warn once about frames listed without an image; refuse a capture with none at all."""
    if capture.missing:
        shown = ", ".join(capture.missing[:5]) + (" ..." if len(capture.missing) > 5 else "")
        total = len(capture.frames) + len(capture.missing)
        if not capture.frames:
            raise SceneFormatError(f"none of the {total} frames listed in {capture.root} has its image file ({shown})")
        log.warning("%d of %d frames listed in %s have no image and are skipped: %s", len(capture.missing), total,
                    capture.root, shown)


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

    def __init__(self, capture: Capture, downscale: int = 1, undistort: bool = True, mask_mode: str = "alpha") -> None:
        if mask_mode not in ("alpha", "ignore"):
            raise SceneFormatError(f"mask_mode must be alpha or ignore, got {mask_mode!r}")
        self.capture, self.downscale, self.undistort, self.mask_mode = capture, downscale, undistort, mask_mode
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
        """Frames ``indices`` with poses ``c2w`` [len(capture), 4, 4] (already normalized)."""
        images, intrinsics, paths, keeps = [], [], [], []
        for i in indices:
            frame = self.capture.frames[i]
            rgba = np.require(load_rgba(frame.image, self.downscale), requirements="W")  # masks are written into it
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
            keep = None
            if self.mask_mode == "ignore":  # the mask (or the photo's alpha) says which pixels to leave out, not a cut-out
                keep = rgba[..., 3] >= 128
                rgba[..., 3] = 255
                self._say("masks mean ignore: masked pixels are left out of the loss and the metrics (data.mask_mode)")
            images.append(rgba)
            keeps.append(keep)
            intrinsics.append(intrinsics_matrix(*(torch.tensor(v) for v in (lens.fx, lens.fy, lens.cx, lens.cy))))
            paths.append(str(frame.image))
        if not images:
            raise SceneFormatError(f"no frames to load from {self.capture.root}")
        poses = torch.tensor(c2w[indices], dtype=torch.float32)
        return stack_photos(images, keeps, poses, torch.stack(intrinsics).float(), paths)


def stack_photos(images: list[np.ndarray], keeps: list[np.ndarray | None], c2w: Tensor, intrinsics: Tensor,
                 paths: list[str]) -> PosedScene:
    """A ``PosedScene`` of photos ``[h, w, 4] uint8`` (any sizes) with their kept pixels (None: all): stacked as they
    are when they share one size, else padded at the right and bottom to the largest width and height."""
    sizes = [(im.shape[1], im.shape[0]) for im in images]
    width, height = max(w for w, _ in sizes), max(h for _, h in sizes)
    mixed = len(set(sizes)) > 1
    if mixed:
        rgba = np.zeros((len(images), height, width, 4), np.uint8)
        rgba[..., 3] = 255  # opaque padding: it is never compared, and it must not read as an object's cut-out
        for k, im in enumerate(images):
            rgba[k, : im.shape[0], : im.shape[1]] = im
    else:
        rgba = np.stack(images)
    keep = None
    if mixed or any(k is not None and not k.all() for k in keeps):
        keep_all = np.zeros((len(images), height, width), bool)
        for k, (im, kept) in enumerate(zip(images, keeps)):
            keep_all[k, : im.shape[0], : im.shape[1]] = True if kept is None else kept
        keep = torch.from_numpy(keep_all)
    cameras = Cameras(c2w, intrinsics, width, height)
    size_tensor = torch.tensor(sizes, dtype=torch.int64) if mixed else None
    return PosedScene(torch.from_numpy(rgba), cameras, paths, size_tensor, keep)
