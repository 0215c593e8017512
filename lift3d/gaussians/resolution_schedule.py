"""A low-to-high resolution schedule for training on photos (as DashGaussian): early steps see the photos downscaled.

Early in training the Gaussians are few and coarse, and a downscaled photo asks for no more detail than they can
give, while a render's cost grows with its pixels: training first at 1/4, then 1/2 of the size spends less time on
the steps that shape the scene coarsely. ``schedule`` is a list of ``[step, factor]`` pairs: from ``step`` on, the
training photos are ``factor`` times smaller on each side (area-averaged, the cameras' intrinsics scaled alike);
before the first pair and after a pair with factor 1 the photos are used as they are. Validation is never scaled.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.config import ConfigError

OPTION = "system.resolution_schedule"


def check_schedule(schedule: Any) -> list[tuple[int, float]]:
    """``schedule`` as (step, factor) pairs, or a one-line ConfigError naming what is wrong."""
    pairs = []
    for entry in schedule or []:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ConfigError(f"{OPTION} is a list of [step, factor] pairs, e.g. [[0, 4], [1000, 2], [3000, 1]]; "
                              f"got the entry {entry!r}")
        step, factor = entry
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"{OPTION}: steps are whole numbers >= 0, got {step!r}")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1:
            raise ConfigError(f"{OPTION}: factors are >= 1 (1 = the photos' own size), got {factor!r}")
        if pairs and step <= pairs[-1][0]:
            raise ConfigError(f"{OPTION}: steps must increase, got {step} after {pairs[-1][0]}")
        pairs.append((step, float(factor)))
    return pairs


def factor_at(schedule: Any, step: int) -> float:
    """The downscale factor of ``step`` (1.0: full size)."""
    factor = 1.0
    for start, value in check_schedule(schedule):
        if step >= start:
            factor = value
    return factor


def scaled_size(width: int, height: int, factor: float) -> tuple[int, int]:
    """The image size at ``factor`` (at least one pixel a side)."""
    return max(round(width / factor), 1), max(round(height / factor), 1)


def _area(images: Tensor, width: int, height: int) -> Tensor:
    """[B, H, W, C] images area-averaged to [B, height, width, C]."""
    resized = F.interpolate(images.permute(0, 3, 1, 2).float(), size=(height, width), mode="area")
    return resized.permute(0, 2, 3, 1).contiguous()


def scaled_batch(batch: dict[str, Any], schedule: Any, step: int) -> dict[str, Any]:
    """An image batch (``cameras``, ``rgb`` [B, H, W, 3], optional ``alpha`` and ``loss_mask`` [B, H, W, 1]) at the
    schedule's size for ``step``; other batches, and every batch at factor 1, pass through unchanged. A downscaled
    loss mask keeps the pixels that are at least half kept."""
    if not schedule or not isinstance(batch, dict) or "rgb" not in batch or not isinstance(batch.get("cameras"), Cameras):
        return batch
    factor = factor_at(schedule, step)
    cameras = batch["cameras"]
    width, height = scaled_size(cameras.width, cameras.height, factor)
    if (width, height) == (cameras.width, cameras.height) or batch["rgb"].ndim != 4:
        return batch
    out = dict(batch)
    intrinsics = cameras.intrinsics.clone()  # scaled in place: a factor tensor made from numbers would wait on the GPU
    intrinsics[:, 0] *= width / cameras.width
    intrinsics[:, 1] *= height / cameras.height
    out["cameras"] = Cameras(cameras.c2w, intrinsics, width, height, cameras.viewmats)
    out["rgb"] = _area(batch["rgb"], width, height)
    if torch.is_tensor(batch.get("alpha")) and batch["alpha"].ndim == 4:
        out["alpha"] = _area(batch["alpha"], width, height)
    if torch.is_tensor(batch.get("loss_mask")):
        out["loss_mask"] = (_area(batch["loss_mask"], width, height) >= 0.5).float()
    return out
