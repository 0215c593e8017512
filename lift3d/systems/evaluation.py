"""What a system's validation and test steps compute, as plain functions: the panels of a validation grid, the
index of each view, its PSNR / SSIM against the photo, and the run's ``metrics.json`` record."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import Tensor

from lift3d.metrics import psnr, ssim
from lift3d.saving import OutputSaver

# the order panels appear in validation grids, with how each is drawn
GRID_PANELS: tuple[tuple[str, str], ...] = (
    ("gt_rgb", "rgb"),
    ("rgb", "rgb"),
    ("normal", "normal"),
    ("depth", "depth"),
    ("alpha", "grayscale"),
)


def grid_panels(out: dict[str, Tensor], batch: dict[str, Any], i: int) -> list[tuple[str, Tensor]]:
    """The panels (kind, image) of view ``i``: the photo when the batch has one, then the renders in GRID_PANELS order."""
    photo = batch.get("rgb")
    images = {**({"gt_rgb": photo} if torch.is_tensor(photo) and photo.ndim == 4 else {}), **out}
    return [(kind, images[key][i]) for key, kind in GRID_PANELS if key in images]


def view_indices(batch: dict[str, Any], batch_idx: int, n: int) -> list[int]:
    """The index of each of the batch's ``n`` views: its ``index`` when given, else counted from ``batch_idx``."""
    index = batch.get("index")
    if torch.is_tensor(index):
        return [int(v) for v in index.reshape(-1).tolist()]
    return [batch_idx * n + i for i in range(n)]


def view_scores(out: dict[str, Tensor], batch: dict[str, Any]) -> Tensor | None:
    """[B, 2] PSNR and SSIM of the renders against the batch's photos (None without photos); pixels outside the
    batch's ``loss_mask`` (data.mask_mode=ignore) are not scored."""
    gt = batch.get("rgb")
    if not (torch.is_tensor(gt) and gt.ndim == 4 and "rgb" in out):
        return None
    prediction = out["rgb"].clamp(0, 1).float()
    mask = batch.get("loss_mask")
    return torch.stack([psnr(prediction, gt.float(), mask), ssim(prediction, gt.float(), mask=mask)], dim=-1)


def record_metrics(saver: OutputSaver, split: str, step: int, scores: dict[str, float]) -> None:
    """Add ``scores`` of ``split`` at ``step`` to ``metrics.json``: its history, and the latest entry per split."""
    path = saver.root / "metrics.json"
    record = json.loads(path.read_text()) if path.exists() else {"history": []}
    entry = {"split": split, "step": step, **scores}
    record["history"].append(entry)
    record[split] = entry
    saver.json("metrics.json", record)
