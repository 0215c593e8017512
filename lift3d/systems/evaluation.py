"""What a system's validation and test steps compute, as plain functions: the labeled panels of a validation grid,
the index of each view, its PSNR / SSIM against the photo, and the run's ``metrics.json`` record."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lift3d.metrics import psnr, ssim
from lift3d.saving import OutputSaver

# the order panels appear in validation grids, with how each is drawn and the label above its column
GRID_PANELS: tuple[tuple[str, str, str], ...] = (
    ("gt_rgb", "rgb", "photo"),
    ("rgb", "rgb", "render"),
    ("normal", "normal", "normal"),
    ("depth", "depth", "depth"),
    ("alpha", "grayscale", "alpha"),
)
LABEL_HEIGHT = 14  # pixels of the label band above each panel of a grid


def grid_panels(out: dict[str, Tensor], batch: dict[str, Any], i: int) -> list[tuple[str, Tensor, str]]:
    """The panels (kind, image, label) of view ``i``: the photo when the batch has one, then the renders in GRID_PANELS
    order."""
    photo = batch.get("rgb")
    images = {**({"gt_rgb": photo} if torch.is_tensor(photo) and photo.ndim == 4 else {}), **out}
    return [(kind, images[key][i], label) for key, kind, label in GRID_PANELS if key in images]


def labeled_panels(panels: list[tuple[Any, ...]]) -> list[tuple[str, np.ndarray]]:
    """Grid panels, (kind, image) or (kind, image, label), as RGB panels with their label in a band above them, so a
    grid says which column is the photo, the render, the depth, ... (a panel without a label gets an empty band)."""
    from PIL import Image, ImageDraw, ImageFont

    from lift3d.imaging import panel_to_rgb

    font = ImageFont.load_default(size=LABEL_HEIGHT - 3)
    labeled = []
    for kind, image, *rest in panels:
        rgb = panel_to_rgb(kind, image)
        band = Image.new("RGB", (rgb.shape[1], LABEL_HEIGHT), (255, 255, 255))
        if rest and rest[0]:
            ImageDraw.Draw(band).text((2, 0), str(rest[0]), fill=(0, 0, 0), font=font)
        labeled.append(("rgb", np.concatenate([np.asarray(band), rgb], axis=0)))
    return labeled


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
