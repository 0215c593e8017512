"""Score distillation sampling (DreamFusion) from Stable Diffusion through diffusers.

Render -> (bilinear resize to ``resolution``) -> VAE encode -> noise at t -> one UNet call on the
[uncond, cond] batch (plus the Perp-Neg negatives) -> guided eps -> ``w(t) (eps_hat - eps)`` injected
as the gradient of ``loss_sds`` w.r.t. the latents. In ``latent_input`` mode the render is the latents.
The frozen weights live outside ``nn.Module`` registration, so they never enter a state dict; running
them (placement, speed options, VAE) is ``lift3d.guidance.latent``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.guidance.latent import LatentDiffusionConfig, LatentDiffusionGuidance
from lift3d.guidance.loading import DiffusionModels, load_stable_diffusion
from lift3d.guidance.prompts import PromptConfig, PromptProcessor
from lift3d.guidance.score import classifier_free_guidance, perp_neg_guidance, to_epsilon
from lift3d.registry import register


@dataclass
class StableDiffusionConfig(LatentDiffusionConfig, PromptConfig):
    """SDS from a Stable Diffusion 1.x/2.x model (hub id or local diffusers folder)."""

    pretrained_model_name_or_path: str = "stabilityai/stable-diffusion-2-1-base"  # hub id or local diffusers folder


@register("stable-diffusion")
class StableDiffusionGuidance(LatentDiffusionGuidance):
    """SDS guidance; ``models`` (tests, benchmarks) replaces loading from ``pretrained_model_name_or_path``."""

    Config = StableDiffusionConfig

    def __init__(self, cfg: Any = None, models: DiffusionModels | None = None) -> None:
        super().__init__(cfg, models)
        self.prompts = PromptProcessor(self.cfg, self.models.model_key, self.models.text_encoder)

    def load_models(self) -> DiffusionModels:
        cfg = self.cfg
        return load_stable_diffusion(cfg.pretrained_model_name_or_path, self.dtype, cfg.variant or None, cfg.local_files_only)

    # ------------------------------------------------------------------ the guided estimate
    def predict_noise(self, x_t: Tensor, t: Tensor, batch: dict[str, Any]) -> Tensor:
        n = x_t.shape[0]
        prompts = self.prompts(batch, n, self.execution_device, self.dtype)
        contexts = [prompts.uncond, prompts.cond]
        if prompts.negatives is not None:
            contexts.append(prompts.negatives.transpose(0, 1).reshape(-1, *prompts.negatives.shape[2:]))
        context = torch.cat(contexts)
        k = context.shape[0] // n  # 2 (CFG) or 5 (Perp-Neg: 3 negatives)
        x_in, t_in = x_t.repeat(k, 1, 1, 1), t.repeat(k)
        out = self.unet_forward(x_in, t_in, context).float()
        eps = to_epsilon(out, x_in, self.alphas_cumprod[t_in], self.prediction_type).reshape(k, *x_t.shape)
        if k == 2:
            return classifier_free_guidance(eps[0], eps[1], self.cfg.guidance_scale)
        return perp_neg_guidance(eps[0], eps[1], eps[2:].transpose(0, 1), prompts.negative_weights, self.cfg.guidance_scale)
