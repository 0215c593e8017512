"""Photos as VGGT takes them, and the map back to each photo's own pixels.

As the authors' loader: each photo (upright, EXIF orientation applied; transparent pixels composited on white) is
resized with a bicubic filter, sides multiples of 14. ``crop``: 518 wide, the height in proportion, center-cropped
to 518 when taller. ``pad``: the longer side 518, the image centered on a white 518 x 518 square. Photos of
different sizes are then centered on white to the largest width and height, since every photo of one forward
pass shares the patch grid. For each photo, ``scale`` and ``offset`` map its pixels to the model's
(``x_model = scale * x_photo + offset``) and ``valid`` marks the model pixels that show the photo.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from lift3d.data.capture import SceneFormatError
from lift3d.data.images import load_rgba

MODES = ("crop", "pad")
TARGET = 518  # VGGT's width (crop) or longer side (pad)
PATCH = 14


@dataclass
class PreparedPhotos:
    """A photo set as one model input, and how each photo sits in it."""

    images: Tensor  # [S, 3, H, W] float32 in 0..1
    sizes: np.ndarray  # [S, 2] int: each photo's (width, height), upright
    scale: np.ndarray  # [S, 2] model pixels per photo pixel (x, y)
    offset: np.ndarray  # [S, 2] where the photo's top-left corner lands in the model image (x, y; negative: cropped)
    valid: Tensor  # [S, H, W] bool: model pixels inside the photo

    def photo_intrinsics(self, model_K: np.ndarray) -> np.ndarray:
        """Intrinsics [S, 3, 3] in each photo's pixels of intrinsics [S, 3, 3] in the model's."""
        K = np.array(model_K, dtype=np.float64, copy=True)
        K[:, 0, 0] /= self.scale[:, 0]
        K[:, 1, 1] /= self.scale[:, 1]
        K[:, 0, 2] = (K[:, 0, 2] - self.offset[:, 0]) / self.scale[:, 0]
        K[:, 1, 2] = (K[:, 1, 2] - self.offset[:, 1]) / self.scale[:, 1]
        return K


def _multiple(value: float) -> int:
    return max(PATCH, int(round(value / PATCH)) * PATCH)


def resized_size(width: int, height: int, mode: str, target: int = TARGET) -> tuple[int, int]:
    """The (width, height) a photo is resized to before any crop or pad."""
    if mode == "crop" or width >= height:
        return target, _multiple(height * target / width)
    return _multiple(width * target / height), target


def prepare_photos(paths: list[Path], mode: str = "crop", target: int = TARGET) -> PreparedPhotos:
    """The photos at ``paths`` as one VGGT input (see the module's docstring); ``target`` replaces 518 (smaller
    inputs for quick checks; the released model is trained at 518)."""
    if mode not in MODES:
        raise SceneFormatError(f"the VGGT resize mode must be {' or '.join(MODES)}, got {mode!r}")
    if target % PATCH or target < PATCH:
        raise SceneFormatError(f"the VGGT input size must be a multiple of {PATCH} pixels, got {target}")
    canvases, sizes, scales, offsets = [], [], [], []
    for path in paths:
        rgba = load_rgba(path)
        height, width = rgba.shape[:2]
        new_w, new_h = resized_size(width, height, mode, target)
        resized = np.asarray(Image.fromarray(rgba).resize((new_w, new_h), Image.Resampling.BICUBIC), np.float32) / 255
        rgb = resized[..., :3] * resized[..., 3:] + (1.0 - resized[..., 3:])  # on white
        box_w, box_h = (target, target) if mode == "pad" else (new_w, min(new_h, target))
        left, top = (box_w - new_w) // 2, (box_h - new_h) // 2  # pad: >= 0; crop of a tall photo: < 0
        canvas = np.ones((box_h, box_w, 3), np.float32)
        valid = np.zeros((box_h, box_w), bool)
        ys, xs = slice(max(top, 0), min(top + new_h, box_h)), slice(max(left, 0), min(left + new_w, box_w))
        canvas[ys, xs] = rgb[ys.start - top: ys.stop - top, xs.start - left: xs.stop - left]
        valid[ys, xs] = True
        canvases.append((canvas, valid))
        sizes.append((width, height))
        scales.append((new_w / width, new_h / height))
        offsets.append((left, top))
    H, W = max(c.shape[0] for c, _ in canvases), max(c.shape[1] for c, _ in canvases)
    images = np.ones((len(paths), H, W, 3), np.float32)
    valid_all = np.zeros((len(paths), H, W), bool)
    for i, (canvas, valid) in enumerate(canvases):  # mixed sizes: centered on white to the largest
        top, left = (H - canvas.shape[0]) // 2, (W - canvas.shape[1]) // 2
        images[i, top:top + canvas.shape[0], left:left + canvas.shape[1]] = canvas
        valid_all[i, top:top + canvas.shape[0], left:left + canvas.shape[1]] = valid
        offsets[i] = (offsets[i][0] + left, offsets[i][1] + top)
    return PreparedPhotos(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), np.array(sizes, np.int64),
                          np.array(scales, np.float64), np.array(offsets, np.float64), torch.from_numpy(valid_all))
