"""Recipes ``dreamfusion`` (NeRF + SDS) and ``prolificdreamer`` (NeRF + VSD, its first stage).

A hash-grid density field with a density blob, shaded by a material (DreamFusion: diffuse albedo with
random lambertian / textureless shading), over a learned environment background, rendered by the
volume renderer from random views and distilled from the guidance. Regularizers on the renders:
orientation (visible normals face the camera), opacity sparsity and entropy, depth variance along rays.
An optional latent warm-up renders the field's first four features as Stable Diffusion latents for
the first ``latent_steps`` steps (Latent-NeRF), skipping the VAE while the coarse shape forms.
The final asset is a textured mesh of the density field (.glb).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.config import scheduled, step_count
from lift3d.registry import register
from lift3d.render.volume.regularizers import depth_variance, opacity_entropy, opacity_sparsity, orientation_loss
from lift3d.systems.field_queries import FieldQueries
from lift3d.systems.stages import take_field
from lift3d.systems.text_to_3d import TextTo3DConfig, TextTo3DLoss, TextTo3DSystem

log = logging.getLogger(__name__)

LATENT_CHANNELS = 4  # Stable Diffusion's latent channels


@dataclass
class DreamFusionLoss(TextTo3DLoss):
    lambda_orient: Any = scheduled(0.0, low=0)  # orientation penalty on normals facing away from the camera (often annealed up)
    lambda_sparsity: Any = scheduled(0.0, low=0)  # mean rendered opacity (empties space; too strong makes the object vanish)
    lambda_entropy: Any = scheduled(0.0, low=0)  # binary entropy of rendered opacity (each ray either hits or misses)
    lambda_z_variance: Any = scheduled(0.0, low=0)  # variance of sample depths along opaque rays (one surface per ray)


@dataclass
class DreamFusionConfig(TextTo3DConfig):
    field_type: str = "implicit-volume"  # registered field
    field: dict = dataclasses.field(default_factory=lambda: {"radius": 2.0, "density_blob": "gaussian"})  # its config
    material_type: str = "diffuse"  # registered material
    material: dict = dataclasses.field(default_factory=dict)  # its config
    background_type: str = "neural-environment"  # registered background
    background: dict = dataclasses.field(default_factory=dict)  # its config
    renderer_type: str = "volume-renderer"  # registered renderer
    renderer: dict = dataclasses.field(default_factory=dict)  # its config
    # first N steps render features[:4] as SD latents (needs field.n_feature_dims >= 4 and SD guidance)
    latent_steps: int = step_count(0)
    eval_normals: bool = True  # render normals for validation grids and test frames
    loss: DreamFusionLoss = dataclasses.field(default_factory=DreamFusionLoss)  # loss weights


class LatentFeatures(nn.Module):
    """A material for the latent warm-up: the field's first four features, unactivated, as latents."""

    requires_normals = False

    def forward(self, features: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return features[..., :LATENT_CHANNELS]


@register("dreamfusion")
class DreamFusionSystem(FieldQueries, TextTo3DSystem):
    """NeRF distilled from a 2D prior (DreamFusion with SDS; ProlificDreamer's first stage with VSD)."""

    Config = DreamFusionConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        self.field = self.build_part(c.field_type, c.field)
        self.material = self.build_part(c.material_type, c.material)
        self.background = self.build_part(c.background_type, c.background)
        self.renderer = self.build_part(c.renderer_type, c.renderer, self.field, self.material, self.background)
        if c.latent_steps > 0:
            n_features = getattr(self.field.cfg, "n_feature_dims", 0)
            if n_features < LATENT_CHANNELS:
                raise ValueError(
                    f"system.latent_steps={c.latent_steps} renders {LATENT_CHANNELS} latent channels from the field's features, "
                    f"but system.field.n_feature_dims is {n_features}: set it to at least {LATENT_CHANNELS}"
                )
            self.latent_material = LatentFeatures()
            self.latent_background = nn.Parameter(torch.zeros(LATENT_CHANNELS))

    def convert_from(self, previous: Any, previous_cfg: Any) -> None:
        """Start from a previous NeRF run: copy every part whose parameters match in names and shapes
        (the field at least; material, background and occupancy grid when they match too)."""
        copied = take_field(self, previous, previous_cfg, "a NeRF stage continues from a field of the same type and encoding")
        log.info("took %s from the previous stage", ", ".join(copied))

    # ------------------------------------------------------------------------------ training
    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self.cfg.latent_steps > 0 and not hasattr(self.guidance, "latent_input"):
            raise ValueError("system.latent_steps needs a guidance that takes latents (stable-diffusion), "
                             f"not '{self.cfg.guidance_type}'")

    def render_for_training(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Renders [B, H, W, C] of the batch's views: RGB, or latents (C = 4) during the latent warm-up."""
        cameras = batch["cameras"]
        normals = self.loss_weight("orient") != 0
        latent = self.true_global_step < self.cfg.latent_steps
        if self.cfg.latent_steps > 0:
            self.guidance.latent_input = latent
        if latent:
            background = self.latent_background.expand(len(cameras), LATENT_CHANNELS)
            return self.renderer(cameras, background=background, material=self.latent_material, compute_normals=normals)
        return self.renderer(cameras, light_positions=batch.get("light_positions"), compute_normals=normals)

    def regularizers(self, out: dict[str, Tensor]) -> dict[str, Tensor]:
        """The render regularizers with a non-zero weight at this step."""
        n_rays = out["alpha"].numel()
        terms: dict[str, Tensor] = {}
        if self.loss_weight("orient") != 0:
            terms["orient"] = orientation_loss(out["weights"], out["sample_normals"], out["sample_directions"], n_rays)
        if self.loss_weight("sparsity") != 0:
            terms["sparsity"] = opacity_sparsity(out["alpha"])
        if self.loss_weight("entropy") != 0:
            terms["entropy"] = opacity_entropy(out["alpha"])
        if self.loss_weight("z_variance") != 0:
            terms["z_variance"] = depth_variance(out["weights"], out["sample_t"], out["ray_indices"], n_rays)
        return terms

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        out = self.render_for_training(batch)
        terms = self.distill(out["rgb"], batch)
        terms.update(self.regularizers(out))
        self.log_step("train/opacity", out["alpha"].detach().mean())
        return self.total_loss(terms)

    # ------------------------------------------------------------------------------ evaluation and export
    def render(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        out = self.renderer(batch["cameras"], background=batch.get("background"), light_positions=batch.get("light_positions"),
                            compute_normals=self.cfg.eval_normals)
        return {k: out[k] for k in ("rgb", "alpha", "depth", "normal") if k in out}


@dataclass
class ProlificDreamerConfig(DreamFusionConfig):
    guidance_type: str = "stable-diffusion-vsd"  # VSD: SDS against a LoRA model of the renders
    material_type: str = "emission"  # color straight from the field (ProlificDreamer's NeRF stage has no shading)


@register("prolificdreamer")
class ProlificDreamerSystem(DreamFusionSystem):
    """ProlificDreamer's NeRF stage: the DreamFusion system with VSD guidance and unshaded color.
    Its checkpoints hold the LoRA state; later stages start from them (``geometry_convert_from``)."""

    Config = ProlificDreamerConfig
