"""A test-only system: a sphere with a trainable radius standing in for a NeRF system (density, albedo,
renders), exporting through ``lift3d.export.export_formats`` so ``lift3d export`` runs end to end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.config import scheduled
from lift3d.export import ExportConfig, ExportSources, export_formats, mesh_from_field
from lift3d.registry import register
from lift3d.systems.base import BaseSystem, LossConfig, SystemConfig
from tests.plugins.analytic_sphere import position_color, render_sphere, sphere_density


@dataclass
class AnalyticSphereLoss(LossConfig):
    lambda_radius: Any = scheduled(1.0)  # weight of the pull towards the target radius


@dataclass
class AnalyticSphereConfig(SystemConfig):
    radius: float = 0.4  # initial sphere radius
    target_radius: float = 0.5  # radius the training pulls towards
    loss: AnalyticSphereLoss = field(default_factory=AnalyticSphereLoss)
    export: ExportConfig = field(default_factory=ExportConfig)  # how assets are exported


@register("test-analytic-sphere")
class AnalyticSphereSystem(BaseSystem):
    """A sphere with a trainable radius: a stand-in for a NeRF system with density, albedo and renders."""

    Config = AnalyticSphereConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.radius = nn.Parameter(torch.tensor(float(self.cfg.radius)))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        return self.total_loss({"radius": (self.radius - self.cfg.target_radius) ** 2})

    def density(self, points: Tensor) -> Tensor:
        return sphere_density(points, float(self.radius))

    def render_views(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        return render_sphere(batch["cameras"].to(self.device), float(self.radius))

    def export(self, saver, formats):
        cfg = self.cfg.export
        sources = ExportSources(
            mesh=lambda: mesh_from_field(self.density, [[-1, -1, -1], [1, 1, 1]], cfg, color_fn=position_color),
            color_fn=position_color,
            render_fn=lambda cameras: self.render_views({"cameras": cameras}),
        )
        return export_formats(saver, formats or cfg.formats, cfg, sources, stem=f"it{self.true_global_step}")
