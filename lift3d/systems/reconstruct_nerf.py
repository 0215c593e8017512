"""Recipe ``reconstruct-nerf``: fit an implicit volume (hash grid) to posed photos by volume rendering.

Wires a field, a material, a background and the volume renderer; the photometric loss compares
rendered rays (``batch_mode: rays``) or whole images (``batch_mode: image``) with the photos. Validation
scores PSNR/SSIM on the val split into ``save/metrics.json``; test renders the orbit video.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.config import scheduled
from lift3d.export import ExportConfig
from lift3d.registry import register
from lift3d.systems.base import BaseSystem, LossConfig, SystemConfig
from lift3d.systems.field_queries import FieldQueries


@dataclass
class ReconstructNerfLoss(LossConfig):
    lambda_rgb: Any = scheduled(1.0)  # photometric loss on the composited colour
    lambda_alpha: Any = scheduled(0.0)  # MSE between rendered opacity and the photo's alpha (object masks)
    lambda_sparsity: Any = scheduled(0.0)  # mean rendered opacity (discourages floaters)


@dataclass
class ReconstructNerfConfig(SystemConfig):
    field_type: str = "implicit-volume"  # registered field
    field: dict = dataclasses.field(default_factory=lambda: {"radius": 1.5, "n_feature_dims": 15})  # its config
    material_type: str = "neural-radiance"  # registered material
    material: dict = dataclasses.field(default_factory=dict)  # its config
    background_type: str = "solid-color"  # registered background (batches with a background override it)
    background: dict = dataclasses.field(default_factory=dict)  # its config
    renderer_type: str = "volume-renderer"  # registered renderer
    renderer: dict = dataclasses.field(default_factory=dict)  # its config
    photometric_loss: str = "mse"  # mse or smooth_l1
    eval_normals: bool = True  # render normals for validation grids (finite differences: slower renders)
    matmul_precision: str = "high"  # torch.set_float32_matmul_precision on CUDA (high: TF32 matmuls)
    loss: ReconstructNerfLoss = dataclasses.field(default_factory=ReconstructNerfLoss)  # loss weights
    export: ExportConfig = dataclasses.field(default_factory=lambda: ExportConfig(
        formats=["glb"], video_distance=4.0, video_fovy_deg=50.0, video_elevation_deg=25.0))  # what lift3d export writes by default


@register("reconstruct-nerf")
class ReconstructNerfSystem(FieldQueries, BaseSystem):
    """Photometric NeRF reconstruction with a hash-grid field and an occupancy-grid renderer."""

    Config = ReconstructNerfConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.photometric_loss not in ("mse", "smooth_l1"):
            raise ValueError(f"photometric_loss must be mse or smooth_l1, got '{c.photometric_loss}'")
        self.field = self.build_part(c.field_type, c.field)
        self.material = self.build_part(c.material_type, c.material)
        self.background = self.build_part(c.background_type, c.background)
        self.renderer = self.build_part(c.renderer_type, c.renderer, self.field, self.material, self.background)

    # ------------------------------------------------------------------------------ training
    def _photometric(self, prediction: Tensor, target: Tensor) -> Tensor:
        if self.cfg.photometric_loss == "mse":
            return ((prediction - target) ** 2).mean(-1)
        return F.smooth_l1_loss(prediction, target, reduction="none", beta=0.1).mean(-1)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        if "rays_o" in batch:
            out = self.renderer.render_rays(batch["rays_o"], batch["rays_d"], background=batch.get("background"))
            target, target_alpha = batch["rgb"], batch.get("alpha")
        else:
            images = self.renderer(batch["cameras"], background=batch.get("background"))
            out = {k: images[k].reshape(-1, images[k].shape[-1]) for k in ("rgb", "alpha")}
            out.update({k: images[k].reshape(-1) for k in ("ray_valid",) if k in images})
            target = batch["rgb"].reshape(-1, 3)
            target_alpha = batch["alpha"].reshape(-1, 1) if "alpha" in batch else None
        valid = out.get("ray_valid")
        weight = torch.ones_like(out["rgb"][:, 0]) if valid is None else valid.reshape(-1).float()
        count = weight.sum().clamp_min(1.0)
        error = self._photometric(out["rgb"], target)
        terms = {"rgb": (error * weight).sum() / count}
        if target_alpha is not None and self.loss_weight("alpha") != 0:
            terms["alpha"] = (((out["alpha"] - target_alpha) ** 2).reshape(-1) * weight).sum() / count
        if self.loss_weight("sparsity") != 0:
            terms["sparsity"] = out["alpha"].mean()
        if self._is_logging_step():
            mse = (((out["rgb"].detach() - target) ** 2).mean(-1) * weight).sum() / count
            self.log_step("train/psnr", -10.0 * torch.log10(mse.clamp_min(1e-10)), prog_bar=True)
            if "num_samples" in out:
                self.log_step("train/samples_per_ray", out["num_samples"] / out["rgb"].shape[0])
            self.log_step("train/occupancy", self.renderer.occupancy.occupancy_fraction())
        return self.total_loss(terms)

    # ------------------------------------------------------------------------------ evaluation
    def render_views(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        out = self.renderer(batch["cameras"], background=batch.get("background"), compute_normals=self.cfg.eval_normals)
        return {k: out[k] for k in ("rgb", "alpha", "depth", "normal") if k in out}
