"""A test-only system: an MLP fits a small procedural image; drives the Lightning loop end to end."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.config import scheduled
from lift3d.registry import register
from lift3d.systems.base import BaseSystem, LossConfig, SystemConfig


def target_image(resolution: int) -> Tensor:
    """A smooth colorful pattern [R, R, 3] in 0..1."""
    y, x = torch.meshgrid(torch.linspace(0, 1, resolution), torch.linspace(0, 1, resolution), indexing="ij")
    return torch.stack([x, y, 0.5 + 0.5 * torch.sin(2 * math.pi * (x + y))], dim=-1)


@dataclass
class FitImageLoss(LossConfig):
    lambda_mse: Any = scheduled(1.0)  # weight of the photometric term
    lambda_smooth: Any = scheduled(0.0)  # weight of a neighbor-difference term


@dataclass
class FitImageConfig(SystemConfig):
    resolution: int = 16  # side of the target image
    hidden: int = 32  # MLP width
    dropout_rate: float = 0.25  # fraction of pixels dropped each step (drawn from the global RNG)
    nan_at_step: int = -1  # inject a NaN loss at this step (tests the non-finite policy)
    loss: FitImageLoss = field(default_factory=FitImageLoss)


@register("test-fit-image")
class FitImageSystem(BaseSystem):
    Config = FitImageConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.mlp = nn.Sequential(nn.Linear(10, self.cfg.hidden), nn.ReLU(), nn.Linear(self.cfg.hidden, 3))
        self.register_buffer("target", target_image(self.cfg.resolution), persistent=False)

    def image(self, resolution: int) -> Tensor:
        axis = torch.linspace(0, 1, resolution, device=self.device)
        y, x = torch.meshgrid(axis, axis, indexing="ij")
        xy = torch.stack([x, y], -1)
        features = torch.cat([xy] + [f(2 * math.pi * k * xy) for k in (1, 2) for f in (torch.sin, torch.cos)], -1)
        return torch.sigmoid(self.mlp(features))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        image = self.image(self.cfg.resolution)
        keep = (torch.rand(image.shape[:2], device=self.device) > self.cfg.dropout_rate).float()[..., None]
        mse = (((image - self.target) ** 2) * keep).mean()
        if self.true_global_step == self.cfg.nan_at_step:
            mse = mse * float("nan")
        smooth = (image[1:] - image[:-1]).abs().mean()
        return self.total_loss({"mse": mse, "smooth": smooth})

    def render_views(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        cameras = batch["cameras"]
        image = self.image(cameras.height)
        rgb = image[None].expand(len(cameras), -1, -1, -1)
        return {"rgb": rgb, "alpha": torch.ones_like(rgb[..., :1]), "depth": rgb[..., :1]}
